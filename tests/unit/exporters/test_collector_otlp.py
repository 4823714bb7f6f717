"""OTLP export: the same series as Prometheus, in the SDK's data model, checked against what the
SDK itself produces (InMemoryMetricReader) for the same observations; the pusher never raises."""

from __future__ import annotations

import json
from typing import Any

import pytest
from mfuscope.collector import Aggregator, StateConfig
from mfuscope.collector._snapshot import STEP_DURATION_BOUNDS_S
from mfuscope.exporters.otlp import OtlpPusher, metrics_data, otlp_metrics_url
from opentelemetry.exporter.otlp.proto.common.metrics_encoder import encode_metrics
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
)
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import (
    AggregationTemporality,
    Gauge,
    Histogram,
    HistogramDataPoint,
    InMemoryMetricReader,
    Metric,
    MetricExporter,
    MetricExportResult,
    MetricsData,
    NumberDataPoint,
    Sum,
)
from opentelemetry.sdk.metrics.view import ExplicitBucketHistogramAggregation, View
from opentelemetry.sdk.resources import Resource

from tests.support.collector_fakes import FakeClock, batch_dict, report_dict

NOW_NS = 1_800_000_000_000_000_000
WALLS = [0.004, 0.5, 0.75, 1.0, 2.0, 400.0]  # includes a bound exactly, and one above the last


def _collector() -> tuple[Aggregator, FakeClock]:
    clock = FakeClock()
    collector = Aggregator(StateConfig(expire_after_s=10), clock=clock)
    reports = [report_dict(i + 1, wall_s=w) for i, w in enumerate(WALLS)]
    collector.ingest(json.dumps(batch_dict(job="j", reports=reports)).encode())
    return collector, clock


def _metrics(collector: Aggregator) -> dict[str, Metric]:
    data = metrics_data(
        collector.families(),
        resource=Resource.create({"service.name": "t"}),
        now_unix_ns=NOW_NS,
        default_start_unix_ns=1,
    )
    # One job: each family is either the job's (its resource) or collector-wide (the collector's).
    return {
        m.name: m
        for resource_metrics in data.resource_metrics
        for scope_metrics in resource_metrics.scope_metrics
        for m in scope_metrics.metrics
    }


def test_same_series_as_prometheus() -> None:
    collector, clock = _collector()
    metrics = _metrics(collector)
    families = {f.otlp_name: f for f in collector.families() if f.samples or f.histogram_samples}
    assert set(metrics) == set(families)
    for name, family in families.items():
        data = metrics[name].data
        if family.kind == "histogram":
            continue
        assert isinstance(data, Sum if family.kind == "counter" else Gauge)
        points = {tuple(p.attributes.values()): p.value for p in data.data_points}  # type: ignore[union-attr]
        assert points == {s.labels: s.value for s in family.samples}, name
        assert metrics[name].unit == family.unit
    steps = metrics["mfuscope_steps"]
    assert isinstance(steps.data, Sum)
    assert steps.data.is_monotonic
    assert steps.data.aggregation_temporality is AggregationTemporality.CUMULATIVE
    (point,) = steps.data.data_points
    assert point.start_time_unix_nano == clock.time_ns()  # when the job's counters started
    assert point.time_unix_nano == NOW_NS
    assert dict(point.attributes or {}) == {"job": "j"}


def test_sized_collective_seconds_and_agent_health_are_exported_with_their_start() -> None:
    clock = FakeClock()
    collector = Aggregator(StateConfig(), clock=clock)
    collective = {"op": "all_reduce", "axis": "dp", "tier": "inter_node", "group_size": 2}
    collective |= {"count": 1, "overlapped_s": 0.0}
    calls = [
        collective | {"bytes": 1024, "seconds": 0.25},
        collective | {"bytes": None, "seconds": 0.5},
    ]
    batch = batch_dict(
        job="j", reports=[report_dict(1, collectives=calls)], health={"reports_dropped_total": 3}
    )
    started = clock.time_ns()
    collector.ingest(json.dumps(batch).encode())
    clock.advance(5)
    metrics = _metrics(collector)
    expected = {
        "mfuscope_collective_seconds": (0.75, "s"),
        "mfuscope_collective_sized_seconds": (0.25, "s"),
        "mfuscope_reports_dropped": (3.0, "{report}"),
    }
    for name, (value, unit) in expected.items():
        data = metrics[name].data
        assert isinstance(data, Sum) and data.is_monotonic, name
        (point,) = data.data_points
        assert (point.value, metrics[name].unit) == (value, unit), name
        assert point.start_time_unix_nano == started, name  # the job's start, not the exporter's


def test_histogram_matches_the_sdk_own_explicit_bucket_histogram() -> None:
    # Oracle: the SDK's histogram aggregation over the same observations with the same bounds.
    reader = InMemoryMetricReader()
    provider = MeterProvider(
        metric_readers=[reader],
        views=[
            View(
                instrument_name="mfuscope_step_duration_seconds",
                aggregation=ExplicitBucketHistogramAggregation(STEP_DURATION_BOUNDS_S),
            )
        ],
    )
    histogram = provider.get_meter("oracle").create_histogram(
        "mfuscope_step_duration_seconds", unit="s"
    )
    for wall in WALLS:
        histogram.record(wall, {"job": "j"})
    sdk_data = reader.get_metrics_data()
    provider.shutdown()
    assert sdk_data is not None
    (sdk_metric,) = sdk_data.resource_metrics[0].scope_metrics[0].metrics
    assert isinstance(sdk_metric.data, Histogram)
    (expected,) = sdk_metric.data.data_points

    collector, _ = _collector()
    ours = _metrics(collector)["mfuscope_step_duration_seconds"]
    assert isinstance(ours.data, Histogram)
    (point,) = ours.data.data_points
    assert isinstance(point, HistogramDataPoint) and isinstance(expected, HistogramDataPoint)
    assert ours.data.aggregation_temporality == sdk_metric.data.aggregation_temporality
    assert list(point.explicit_bounds) == list(expected.explicit_bounds)
    assert list(point.bucket_counts) == list(expected.bucket_counts)
    assert (point.count, point.sum, point.min, point.max) == (
        expected.count,
        pytest.approx(expected.sum),
        expected.min,
        expected.max,
    )
    assert ours.unit == sdk_metric.unit == "s"


def test_encodes_to_the_otlp_protobuf() -> None:
    collector, _ = _collector()
    data = metrics_data(
        collector.families(),
        resource=Resource.create({"service.name": "t"}),
        now_unix_ns=NOW_NS,
        default_start_unix_ns=1,
    )
    wire = encode_metrics(data).SerializeToString()
    decoded = ExportMetricsServiceRequest.FromString(wire)
    names = {m.name for r in decoded.resource_metrics for m in r.scope_metrics[0].metrics}
    assert {"mfuscope_steps", "mfuscope_step_duration_seconds", "mfuscope_mfu_ratio"} <= names


def test_expired_series_are_absent_not_stale() -> None:
    collector, clock = _collector()
    clock.advance(11)
    names = set(_metrics(collector))
    assert "mfuscope_steps" not in names
    assert names == {"mfuscope_reports_rejected"}  # collector-wide, always present


class _Capture(MetricExporter):
    def __init__(self, result: MetricExportResult | Exception = MetricExportResult.SUCCESS) -> None:
        super().__init__()
        self.result = result
        self.exports: list[MetricsData] = []
        self.shut_down = False

    def export(
        self, metrics_data: MetricsData, timeout_millis: float = 10_000, **kwargs: Any
    ) -> MetricExportResult:
        self.exports.append(metrics_data)
        if isinstance(self.result, Exception):
            raise self.result
        return self.result

    def force_flush(self, timeout_millis: float = 10_000) -> bool:
        return True

    def shutdown(self, timeout_millis: float = 30_000, **kwargs: Any) -> None:
        self.shut_down = True


@pytest.mark.parametrize(
    ("result", "ok"),
    [
        (MetricExportResult.SUCCESS, True),
        (MetricExportResult.FAILURE, False),
        (ConnectionError("collector down"), False),
    ],
)
def test_pusher_counts_failures_and_never_raises(
    result: MetricExportResult | Exception, ok: bool
) -> None:
    collector, clock = _collector()
    exporter = _Capture(result)
    pusher = OtlpPusher(collector.families, exporter, interval_s=60, clock_ns=clock.time_ns)
    assert pusher.push_once() is ok
    assert (pusher.exports_total, pusher.failures_total) == (1, 0 if ok else 1)
    point = exporter.exports[0].resource_metrics[0].scope_metrics[0].metrics[0].data.data_points[0]
    assert isinstance(point, NumberDataPoint)
    assert point.time_unix_nano == clock.time_ns()


def test_pusher_stop_flushes_the_final_counts_and_shuts_the_exporter() -> None:
    collector, _ = _collector()
    exporter = _Capture()
    pusher = OtlpPusher(collector.families, exporter, interval_s=3600)
    pusher.start()
    with pytest.raises(RuntimeError, match="already"):
        pusher.start()
    pusher.stop()
    assert len(exporter.exports) == 1
    assert exporter.shut_down


@pytest.mark.parametrize(
    ("endpoint", "url"),
    [
        ("http://otel:4318", "http://otel:4318/v1/metrics"),
        ("http://otel:4318/", "http://otel:4318/v1/metrics"),
        ("https://otel:4318/custom/path", "https://otel:4318/custom/path"),
    ],
)
def test_otlp_metrics_url(endpoint: str, url: str) -> None:
    assert otlp_metrics_url(endpoint) == url


@pytest.mark.parametrize("endpoint", ["otel:4318", "ftp://otel", "http://"])
def test_otlp_endpoint_must_be_http(endpoint: str) -> None:
    with pytest.raises(ValueError, match="http"):
        otlp_metrics_url(endpoint)
