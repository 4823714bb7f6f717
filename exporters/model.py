"""The exporters' data model: metric families as plain frozen data.

The collector turns its aggregated state into these families once per scrape or export; the
Prometheus and OTLP exporters only render them. One model for both keeps the two outputs the same
series by construction.

Names follow Prometheus conventions (docs/definitions.md#counters-and-gauges): counters end in
``_total``; `otlp_name` drops that suffix because OTLP carries the type separately and an
OpenTelemetry Collector's Prometheus exporter adds ``_total`` back to monotonic sums.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Literal

__all__ = ["HistogramSample", "MetricFamily", "MetricKind", "Sample"]

MetricKind = Literal["counter", "gauge", "histogram"]

_NAME = re.compile(r"^[a-zA-Z_:][a-zA-Z0-9_:]*$")
_LABEL = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")


@dataclass(frozen=True)
class Sample:
    """One series of a counter or gauge. `labels` are values in the family's `label_names` order.

    `start_unix_ns` is when a counter series started from zero (OTLP's start time); 0 means
    "unknown" and lets the exporter use its own start.
    """

    labels: tuple[str, ...]
    value: float
    start_unix_ns: int = 0


@dataclass(frozen=True)
class HistogramSample:
    """One histogram series. `bucket_counts[i]` counts observations in ``(bounds[i-1], bounds[i]]``
    (upper bound inclusive, as in both Prometheus ``le`` and OTLP explicit buckets); the last entry
    counts those above the last bound. Counts are per bucket, not cumulative."""

    labels: tuple[str, ...]
    bucket_counts: tuple[int, ...]
    sum: float
    min: float
    max: float
    start_unix_ns: int = 0

    @property
    def count(self) -> int:
        return sum(self.bucket_counts)


@dataclass(frozen=True)
class MetricFamily:
    """A metric and its series. `unit` is the UCUM unit sent with OTLP (``s``, ``By``, ``1``, or an
    annotation such as ``{flop}``); `bounds` are the histogram's upper bounds in base units."""

    name: str
    kind: MetricKind
    help: str
    unit: str
    label_names: tuple[str, ...]
    samples: tuple[Sample, ...] = ()
    histogram_samples: tuple[HistogramSample, ...] = ()
    bounds: tuple[float, ...] = ()

    def __post_init__(self) -> None:
        if not _NAME.match(self.name):
            raise ValueError(f"invalid metric name {self.name!r}")
        if (self.kind == "counter") != self.name.endswith("_total"):
            raise ValueError(f"{self.name}: counters, and only counters, end in _total")
        for label in self.label_names:
            if not _LABEL.match(label) or label == "le":
                raise ValueError(f"{self.name}: invalid label name {label!r}")
        width = len(self.label_names)
        for labels in [s.labels for s in self.samples] + [h.labels for h in self.histogram_samples]:
            if len(labels) != width:
                raise ValueError(f"{self.name}: sample labels {labels} != {self.label_names}")
        if self.kind == "histogram":
            if self.samples:
                raise ValueError(f"{self.name}: a histogram carries histogram_samples only")
            if list(self.bounds) != sorted(set(self.bounds)) or not all(
                math.isfinite(b) for b in self.bounds
            ):
                raise ValueError(f"{self.name}: bounds must be finite and strictly increasing")
            for h in self.histogram_samples:
                if len(h.bucket_counts) != len(self.bounds) + 1:
                    raise ValueError(f"{self.name}: expected {len(self.bounds) + 1} buckets")
        elif self.histogram_samples or self.bounds:
            raise ValueError(f"{self.name}: only histograms carry buckets")

    @property
    def otlp_name(self) -> str:
        """The OTLP metric name: the Prometheus name without the counter suffix ``_total``."""
        return self.name[: -len("_total")] if self.kind == "counter" else self.name
