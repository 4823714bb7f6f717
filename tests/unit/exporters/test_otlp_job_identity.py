"""OTLP job identity: the protobuf the exporter sends, decoded and put through the OTLP to
Prometheus translation that Prometheus' OTLP receiver, the OpenTelemetry Collector's Prometheus
exporters and Mimir apply (`job` = ``service.namespace/service.name``, `instance` =
``service.instance.id``, both overwriting data-point attributes), gives back exactly the series of
the Prometheus exposition with each training job under its own name."""

from __future__ import annotations

import json
import re

import pytest
from mfuscope.collector import Aggregator, StateConfig
from mfuscope.collector._errors import BadRequest
from mfuscope.exporters.model import MetricFamily
from mfuscope.exporters.otlp import COLLECTOR_SERVICE_NAME, collector_resource, metrics_data
from opentelemetry.exporter.otlp.proto.common.metrics_encoder import encode_metrics
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
)

from tests.support.collector_fakes import FakeClock, batch_dict

Series = tuple[str, frozenset[tuple[str, str]]]
INSTANCE = "node-17:9464"


def _translate(request: ExportMetricsServiceRequest) -> set[Series]:
    """The Prometheus series an OTLP translation makes of `request` (names with ``_total`` added to
    monotonic sums, attribute names with invalid characters as ``_``; histograms by their name)."""
    series: set[Series] = set()
    for resource_metrics in request.resource_metrics:
        resource = {a.key: a.value.string_value for a in resource_metrics.resource.attributes}
        identity: dict[str, str] = {}
        if "service.name" in resource:
            namespace = resource.get("service.namespace")
            name = resource["service.name"]
            identity["job"] = f"{namespace}/{name}" if namespace else name
        if "service.instance.id" in resource:
            identity["instance"] = resource["service.instance.id"]
        for scope_metrics in resource_metrics.scope_metrics:
            for metric in scope_metrics.metrics:
                kind = metric.WhichOneof("data")
                points = getattr(metric, kind).data_points
                name = metric.name + ("_total" if kind == "sum" and metric.sum.is_monotonic else "")
                for point in points:
                    labels = {
                        re.sub(r"[^a-zA-Z0-9_]", "_", a.key): a.value.string_value
                        for a in point.attributes
                    }
                    labels |= identity  # the resource wins over a data point's `job`
                    series.add((name, frozenset(labels.items())))
    return series


def _exposition(families: list[MetricFamily], collector_job: str) -> set[Series]:
    series: set[Series] = set()
    for family in families:
        for labels in [s.labels for s in family.samples] + [
            h.labels for h in family.histogram_samples
        ]:
            named = dict(zip(family.label_names, labels, strict=True))
            named.setdefault("job", collector_job)
            named["instance"] = INSTANCE
            series.add((family.name, frozenset(named.items())))
    return series


def _collector(per_rank_labels: bool) -> Aggregator:
    collector = Aggregator(StateConfig(per_rank_labels=per_rank_labels), clock=FakeClock())
    for job in ("llama-70b", "bert-large"):
        for rank in (0, 1):
            batch = batch_dict(job=job, rank=rank, world_size=2)
            collector.ingest(json.dumps(batch).encode())
    with pytest.raises(BadRequest):  # a collector-wide series: the rejected-batch counter
        collector.ingest(b"not json")
    return collector


@pytest.mark.parametrize("per_rank_labels", [False, True])
@pytest.mark.parametrize("namespace", [None, "team-a"])
def test_each_training_job_keeps_its_name_through_the_prometheus_translation(
    per_rank_labels: bool, namespace: str | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    extra = "k8s.cluster.name=c1" + (f",service.namespace={namespace}" if namespace else "")
    monkeypatch.setenv("OTEL_RESOURCE_ATTRIBUTES", extra)
    collector = _collector(per_rank_labels)
    families = [f for f in collector.families() if f.samples or f.histogram_samples]
    data = metrics_data(
        families,
        resource=collector_resource(INSTANCE),
        now_unix_ns=1_800_000_000_000_000_000,
        default_start_unix_ns=1,
    )
    sent = ExportMetricsServiceRequest.FromString(encode_metrics(data).SerializeToString())

    translated = _translate(sent)

    collector_job = f"{namespace}/{COLLECTOR_SERVICE_NAME}" if namespace else COLLECTOR_SERVICE_NAME
    assert translated == _exposition(families, collector_job)
    jobs = {dict(labels)["job"] for _, labels in translated}
    assert jobs == {"llama-70b", "bert-large", collector_job}
    steps = [dict(labels) for name, labels in translated if name == "mfuscope_steps_total"]
    ranks = {labels.get("rank") for labels in steps} - {None}
    assert ranks == ({"0", "1"} if per_rank_labels else set())
    resources = {
        a.key: a.value.string_value
        for r in sent.resource_metrics
        for a in r.resource.attributes
        if a.key == "k8s.cluster.name"
    }
    assert resources == {"k8s.cluster.name": "c1"}  # the collector's other attributes carry over


def test_the_old_single_resource_mapping_would_have_merged_the_jobs() -> None:
    # The failure this design prevents, shown with the same translation: one resource for all.
    collector = _collector(per_rank_labels=False)
    data = metrics_data(
        collector.families(),
        resource=collector_resource(INSTANCE),
        now_unix_ns=1,
        default_start_unix_ns=1,
    )
    sent = encode_metrics(data)
    merged = ExportMetricsServiceRequest()
    merged.resource_metrics.add().CopyFrom(sent.resource_metrics[0])
    for other in sent.resource_metrics[1:]:
        merged.resource_metrics[0].scope_metrics.extend(other.scope_metrics)
    assert {dict(labels)["job"] for _, labels in _translate(merged)} == {COLLECTOR_SERVICE_NAME}
