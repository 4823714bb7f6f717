"""OTLP export of the same metric families, through opentelemetry-sdk's data model and exporter.

Why not SDK instruments: the families are already aggregated (cumulative counters and histogram
buckets kept by the collector). Replaying them through observable instruments would keep an SDK
aggregation for every attribute set ever seen (memory grows as jobs come and go, and past the
SDK's cardinality limit of 2,000 series per instrument points collapse into an overflow series),
and a synchronous step-time histogram would keep exporting jobs long expired. Building the SDK's
`MetricsData` from the families instead exports exactly the Prometheus series: counters as
cumulative monotonic sums, gauges as gauges, the histogram with its explicit bucket bounds in
seconds (OTel's default bounds are milliseconds-oriented), and expired series simply absent.

Job identity: every translation of OTLP into Prometheus series (Prometheus' own OTLP receiver, the
OpenTelemetry Collector's Prometheus and remote-write exporters, Mimir) sets the `job` label from
the resource's ``service.namespace/service.name`` and `instance` from ``service.instance.id``,
overwriting a data-point attribute of the same name. So the series of each training job go out
under their own resource whose ``service.name`` is the job's name (no ``service.namespace``, which
would be prefixed to it), and the data points keep their `job` attribute with the same value for
backends that read attributes as they are. Series without a job (collector-wide ones) stay under
the collector's resource. ``service.instance.id`` names the collector, so that sidecars pushing
the same job stay distinct series.

`OtlpPusher` is the background shell: every interval it builds the families, converts and hands
them to a `MetricExporter` (OTLP/HTTP protobuf in production). Failures are counted and logged at
most once per interval; they never propagate into the collector.
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from urllib.parse import urlsplit, urlunsplit

from mfuscope.exporters.model import HistogramSample, MetricFamily, Sample
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

__all__ = [
    "COLLECTOR_SERVICE_NAME",
    "OtlpPusher",
    "collector_resource",
    "job_resource",
    "metrics_data",
    "new_otlp_http_exporter",
    "otlp_metrics_url",
]

_log = logging.getLogger(__name__)
_SCOPE = InstrumentationScope("mfuscope.collector")
FamilySource = Callable[[], Sequence[MetricFamily]]
COLLECTOR_SERVICE_NAME = "mfuscope-collector"
_JOB_LABEL = "job"
# Translations join these into the `job` label; a per-job resource must not carry the namespace.
_SERVICE_NAME, _SERVICE_NAMESPACE = "service.name", "service.namespace"


def collector_resource(instance_id: str | None = None) -> Resource:
    """The collector's own resource: ``service.name=mfuscope-collector`` and
    ``service.instance.id=instance_id`` (default: the host name), merged over what
    ``OTEL_RESOURCE_ATTRIBUTES`` adds (e.g. ``k8s.cluster.name``)."""
    return Resource.create(
        {
            _SERVICE_NAME: COLLECTOR_SERVICE_NAME,
            "service.instance.id": instance_id or socket.gethostname(),
        }
    )


def job_resource(collector: Resource, job: str) -> Resource:
    """The resource for training job `job`'s series: the collector's attributes (instance id,
    cluster, ...) with ``service.name=job`` and no ``service.namespace``."""
    attributes = {k: v for k, v in collector.attributes.items() if k != _SERVICE_NAMESPACE}
    attributes[_SERVICE_NAME] = job
    return Resource(attributes, collector.schema_url)


def _split_by_job(family: MetricFamily) -> dict[str | None, MetricFamily]:
    """`family`'s series grouped by their `job` label value (None: the family has no job)."""
    if _JOB_LABEL not in family.label_names:
        return {None: family}
    at = family.label_names.index(_JOB_LABEL)
    samples: dict[str | None, list[Sample]] = {}
    histograms: dict[str | None, list[HistogramSample]] = {}
    for s in family.samples:
        samples.setdefault(s.labels[at], []).append(s)
    for h in family.histogram_samples:
        histograms.setdefault(h.labels[at], []).append(h)
    return {
        job: replace(
            family,
            samples=tuple(samples.get(job, ())),
            histogram_samples=tuple(histograms.get(job, ())),
        )
        for job in samples.keys() | histograms.keys()
    }


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
    """The SDK `MetricsData` for `families` at `now_unix_ns`: series without a job under
    `resource` (the collector's), each training job's series under `job_resource(resource, job)`.
    Families without series are left out (OTLP has no empty metric); a counter sample without its
    own start uses `default_start_unix_ns` (when the exporting process started counting)."""
    by_job: dict[str | None, list[Metric]] = {}
    for family in families:
        for job, part in _split_by_job(family).items():
            if part.samples or part.histogram_samples:
                metric = _to_metric(part, now_unix_ns, default_start_unix_ns)
                by_job.setdefault(job, []).append(metric)
    jobs = sorted(job for job in by_job if job is not None)
    return MetricsData(
        resource_metrics=[
            ResourceMetrics(
                resource=resource if job is None else job_resource(resource, job),
                scope_metrics=[ScopeMetrics(scope=_SCOPE, metrics=by_job[job], schema_url="")],
                schema_url="",
            )
            for job in ([None] if None in by_job else []) + jobs
        ]
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
        self._resource = resource or collector_resource()
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
