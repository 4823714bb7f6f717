"""OTLP export of the same metric families, through opentelemetry-sdk's data model and exporter.

Why not SDK instruments: the families are already aggregated (cumulative counters and histogram
buckets kept by the collector). Replaying them through observable instruments would keep an SDK
aggregation for every attribute set ever seen (memory grows as jobs come and go, and past the
SDK's cardinality limit of 2,000 series per instrument points collapse into an overflow series),
and a synchronous step-time histogram would keep exporting jobs long expired. Building the SDK's
`MetricsData` from the families instead exports exactly the Prometheus series: counters as
cumulative monotonic sums, gauges as gauges, the histogram with its explicit bucket bounds in
seconds (OTel's default bounds are milliseconds-oriented), and expired series simply absent.

`OtlpPusher` is the background shell: every interval it builds the families, converts and hands
them to a `MetricExporter` (OTLP/HTTP protobuf in production). Failures are counted and logged at
most once per interval; they never propagate into the collector.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from urllib.parse import urlsplit, urlunsplit

from mfuscope.exporters.model import MetricFamily
from opentelemetry.sdk.metrics.export import (
    AggregationTemporality,
    Gauge,
    Histogram,
    HistogramDataPoint,
    Metric,
    MetricExporter,
    MetricExportResult,
    MetricsData,
    NumberDataPoint,
    ResourceMetrics,
    ScopeMetrics,
    Sum,
)
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.util.instrumentation import InstrumentationScope

__all__ = ["OtlpPusher", "metrics_data", "new_otlp_http_exporter", "otlp_metrics_url"]

_log = logging.getLogger(__name__)
_SCOPE = InstrumentationScope("mfuscope.collector")
FamilySource = Callable[[], Sequence[MetricFamily]]


def _attributes(family: MetricFamily, labels: tuple[str, ...]) -> dict[str, str]:
    return dict(zip(family.label_names, labels, strict=True))


def _to_metric(family: MetricFamily, now_unix_ns: int, default_start_unix_ns: int) -> Metric:
    def start(sample_start: int) -> int:
        return sample_start or default_start_unix_ns

    if family.kind == "counter":
        data: Sum | Gauge | Histogram = Sum(
            data_points=[
                NumberDataPoint(
                    attributes=_attributes(family, s.labels),
                    start_time_unix_nano=start(s.start_unix_ns),
                    time_unix_nano=now_unix_ns,
                    value=float(s.value),
                )
                for s in family.samples
            ],
            aggregation_temporality=AggregationTemporality.CUMULATIVE,
            is_monotonic=True,
        )
    elif family.kind == "gauge":
        data = Gauge(
            data_points=[
                NumberDataPoint(
                    attributes=_attributes(family, s.labels),
                    start_time_unix_nano=0,
                    time_unix_nano=now_unix_ns,
                    value=float(s.value),
                )
                for s in family.samples
            ]
        )
    else:
        data = Histogram(
            data_points=[
                HistogramDataPoint(
                    attributes=_attributes(family, h.labels),
                    start_time_unix_nano=start(h.start_unix_ns),
                    time_unix_nano=now_unix_ns,
                    count=h.count,
                    sum=float(h.sum),
                    bucket_counts=list(h.bucket_counts),
                    explicit_bounds=list(family.bounds),
                    min=float(h.min),
                    max=float(h.max),
                )
                for h in family.histogram_samples
            ],
            aggregation_temporality=AggregationTemporality.CUMULATIVE,
        )
    return Metric(name=family.otlp_name, description=family.help, unit=family.unit, data=data)


def metrics_data(
    families: Sequence[MetricFamily],
    *,
    resource: Resource,
    now_unix_ns: int,
    default_start_unix_ns: int,
) -> MetricsData:
    """The SDK `MetricsData` for `families` at `now_unix_ns`. Families without series are left out
    (OTLP has no empty metric); a counter sample without its own start uses
    `default_start_unix_ns` (when the exporting process started counting)."""
    metrics = [
        _to_metric(f, now_unix_ns, default_start_unix_ns)
        for f in families
        if f.samples or f.histogram_samples
    ]
    scope = ScopeMetrics(scope=_SCOPE, metrics=metrics, schema_url="")
    return MetricsData(
        resource_metrics=[ResourceMetrics(resource=resource, scope_metrics=[scope], schema_url="")]
    )


def otlp_metrics_url(endpoint: str) -> str:
    """The OTLP/HTTP metrics URL for `endpoint`: a bare ``http://host:4318`` (or one ending in
    ``/``) gets the standard signal path ``/v1/metrics``; a URL with a path is taken as is."""
    parts = urlsplit(endpoint)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ValueError(f"OTLP endpoint must be an http(s) URL, got {endpoint!r}")
    if parts.path in ("", "/"):
        parts = parts._replace(path="/v1/metrics")
    return urlunsplit(parts)


def new_otlp_http_exporter(
    endpoint: str, *, headers: Mapping[str, str] | None = None, timeout_s: float = 10.0
) -> MetricExporter:
    """An OTLP/HTTP (protobuf) metric exporter for `endpoint` (see `otlp_metrics_url`)."""
    # Imported here: it pulls in requests and protobuf, which a collector without OTLP never needs.
    from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter

    return OTLPMetricExporter(
        endpoint=otlp_metrics_url(endpoint), headers=dict(headers or {}), timeout=timeout_s
    )


class OtlpPusher:
    """Pushes the families to `exporter` every `interval_s` seconds on a daemon thread.

    `clock_ns` gives wall-clock Unix nanoseconds (injected for tests). `push_once` does one export
    synchronously and returns whether it succeeded; the thread calls it and never raises.
    """

    def __init__(
        self,
        source: FamilySource,
        exporter: MetricExporter,
        *,
        interval_s: float,
        resource: Resource | None = None,
        clock_ns: Callable[[], int] = time.time_ns,
        timeout_s: float = 10.0,
    ) -> None:
        if not interval_s > 0:
            raise ValueError(f"interval_s must be > 0, got {interval_s}")
        self._source = source
        self._exporter = exporter
        self._interval_s = interval_s
        self._timeout_ms = timeout_s * 1e3
        self._resource = resource or Resource.create({"service.name": "mfuscope-collector"})
        self._clock_ns = clock_ns
        self._start_unix_ns = clock_ns()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.exports_total = 0
        self.failures_total = 0

    def push_once(self) -> bool:
        try:
            data = metrics_data(
                self._source(),
                resource=self._resource,
                now_unix_ns=self._clock_ns(),
                default_start_unix_ns=self._start_unix_ns,
            )
            result = self._exporter.export(data, timeout_millis=self._timeout_ms)
            error: BaseException | None = None
        except (
            Exception
        ) as exc:  # a telemetry exporter logs and carries on, never crashing its host
            result, error = MetricExportResult.FAILURE, exc
        self.exports_total += 1
        if result is MetricExportResult.SUCCESS:
            return True
        self.failures_total += 1
        # One line per failed push, and pushes are `interval_s` apart: at most one log per interval.
        _log.warning(
            "OTLP export failed (%d of %d exports)%s",
            self.failures_total,
            self.exports_total,
            f": {error!r}" if error else "",
        )
        return False

    def _run(self) -> None:
        while not self._stop.wait(self._interval_s):
            self.push_once()

    def start(self) -> None:
        if self._thread is not None:
            raise RuntimeError("OtlpPusher already started")
        self._thread = threading.Thread(target=self._run, name="mfuscope-otlp", daemon=True)
        self._thread.start()

    def stop(self, *, flush: bool = True) -> None:
        """Stop the thread; with `flush`, push one last time so the final counts are exported."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self._timeout_ms / 1e3 + self._interval_s)
            self._thread = None
        if flush:
            self.push_once()
        self._exporter.shutdown(timeout_millis=self._timeout_ms)
