"""Prometheus exposition of metric families through prometheus-client.

`FamiliesCollector` is a custom prometheus-client collector (the structural ``collect()``
protocol): each scrape asks its source for the current families, which the collector builds from
its aggregated counters, never by walking stored reports. `render` negotiates the text format
(classic 0.0.4 or OpenMetrics) from the scrape's ``Accept`` header, as prometheus-client's own
HTTP handler does.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import cast

from mfuscope.exporters.model import MetricFamily
from prometheus_client import CollectorRegistry
from prometheus_client.exposition import choose_encoder
from prometheus_client.metrics_core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.utils import floatToGoString

__all__ = ["FamiliesCollector", "new_registry", "render", "to_prometheus"]

# prometheus-client's own `le` formatting (Go float syntax), untyped upstream.
_format_bound = cast(Callable[[float], str], floatToGoString)

FamilySource = Callable[[], Sequence[MetricFamily]]


def to_prometheus(family: MetricFamily) -> Metric:
    """Convert one family into the prometheus-client metric family of the same type."""
    labels = list(family.label_names)
    if family.kind == "counter":
        counter = CounterMetricFamily(family.name, family.help, labels=labels)
        for sample in family.samples:
            counter.add_metric(sample.labels, sample.value)
        return counter
    if family.kind == "gauge":
        gauge = GaugeMetricFamily(family.name, family.help, labels=labels)
        for sample in family.samples:
            gauge.add_metric(sample.labels, sample.value)
        return gauge
    histogram = HistogramMetricFamily(family.name, family.help, labels=labels)
    upper = [_format_bound(b) for b in family.bounds] + ["+Inf"]
    for h in family.histogram_samples:
        cumulative: list[tuple[str, float]] = []
        running = 0
        for le, count in zip(upper, h.bucket_counts, strict=True):
            running += count
            cumulative.append((le, float(running)))
        histogram.add_metric(h.labels, cumulative, h.sum)
    return histogram


class FamiliesCollector:
    """A prometheus-client collector over a source of `MetricFamily` (called once per scrape)."""

    def __init__(self, source: FamilySource) -> None:
        self._source = source

    def collect(self) -> Iterator[Metric]:
        for family in self._source():
            yield to_prometheus(family)


def new_registry(source: FamilySource) -> CollectorRegistry:
    """A fresh registry holding only a `FamiliesCollector` over `source` (no process metrics:
    the series are a public contract and must not change with the host)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(FamiliesCollector(source))
    return registry


def render(registry: CollectorRegistry, accept: str = "") -> tuple[bytes, str]:
    """Render `registry` in the format the ``Accept`` header asks for: (body, content type)."""
    encoder, content_type = choose_encoder(accept)
    return encoder(registry), content_type
