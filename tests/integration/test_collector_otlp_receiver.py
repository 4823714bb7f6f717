"""OTLP/HTTP end to end: a real collector process pushes to a local OTLP/HTTP receiver (a tiny
HTTP server in the test that decodes the protobuf with `opentelemetry.proto`)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from mfuscope.collector._snapshot import STEP_DURATION_BOUNDS_S
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
)

from tests.support.collector_fakes import batch_dict, report_dict

pytestmark = pytest.mark.slow


class Receiver:
    def __init__(self) -> None:
        self.requests: list[ExportMetricsServiceRequest] = []
        self.paths: list[str] = []
        self.content_types: list[str] = []
        self.lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                with receiver.lock:
                    receiver.paths.append(self.path)
                    receiver.content_types.append(self.headers.get("Content-Type", ""))
                    receiver.requests.append(ExportMetricsServiceRequest.FromString(body))
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, format: str, *args: object) -> None:
                return None

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()
        self.endpoint = f"http://127.0.0.1:{self.server.server_address[1]}"

    def latest_steps(self) -> float | None:
        with self.lock:
            requests = list(self.requests)
        for req in reversed(requests):
            for metric in (
                m for r in req.resource_metrics for s in r.scope_metrics for m in s.metrics
            ):
                if metric.name == "mfuscope_steps":
                    return metric.sum.data_points[0].as_double
        return None

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver()
    yield r
    r.close()


def test_collector_pushes_the_same_series_over_otlp_http(
    receiver: Receiver, tmp_path: Path
) -> None:
    address_file = tmp_path / "address"
    cmd = [sys.executable, "-m", "mfuscope.cli", "collector", "--listen", "127.0.0.1:0"]
    cmd += ["--address-file", str(address_file), "--otlp-endpoint", receiver.endpoint]
    proc = subprocess.Popen(
        cmd,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "MFUSCOPE_OTLP_INTERVAL_S": "0.2"},
    )
    try:
        deadline = time.monotonic() + 30
        while not address_file.exists():
            assert proc.poll() is None and time.monotonic() < deadline, "collector did not start"
            time.sleep(0.02)
        url = "http://" + address_file.read_text().strip()
        body = json.dumps(
            batch_dict(job="otlp", reports=[report_dict(1), report_dict(2, wall_s=0.5)])
        ).encode()
        with urllib.request.urlopen(
            urllib.request.Request(
                url + "/v1/reports", data=body, headers={"Content-Type": "application/json"}
            )
        ) as r:
            assert json.loads(r.read())["accepted"] == 2
        while receiver.latest_steps() != 2.0:
            assert time.monotonic() < deadline + 30, "no OTLP export with the batch arrived"
            time.sleep(0.05)
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert set(receiver.paths) == {"/v1/metrics"}
    assert set(receiver.content_types) == {"application/x-protobuf"}

    last = receiver.requests[-1]  # the flush at shutdown
    # The collector-wide series under the collector's resource, the job's under one named after
    # the job (what OTLP-to-Prometheus translations make the `job` label), same instance id.
    resources = [
        {a.key: a.value.string_value for a in r.resource.attributes} for r in last.resource_metrics
    ]
    assert [r["service.name"] for r in resources] == ["mfuscope-collector", "otlp"]
    assert "service.namespace" not in resources[1]
    (instance,) = {r["service.instance.id"] for r in resources}
    assert instance.endswith(":" + url.rsplit(":", 1)[1])  # host:port of this collector
    metrics = {m.name: m for r in last.resource_metrics for s in r.scope_metrics for m in s.metrics}
    steps = metrics["mfuscope_steps"]
    assert steps.sum.is_monotonic and steps.sum.aggregation_temporality == 2  # CUMULATIVE
    (point,) = steps.sum.data_points
    assert {a.key: a.value.string_value for a in point.attributes} == {"job": "otlp"}
    assert 0 < point.start_time_unix_nano <= point.time_unix_nano
    histogram = metrics["mfuscope_step_duration_seconds"].histogram
    (hpoint,) = histogram.data_points
    assert list(hpoint.explicit_bounds) == list(STEP_DURATION_BOUNDS_S)
    assert (hpoint.count, hpoint.sum, hpoint.min, hpoint.max) == (2, 1.5, 0.5, 1.0)
    assert metrics["mfuscope_step_duration_seconds"].unit == "s"
    mfu = metrics["mfuscope_mfu_ratio"].gauge.data_points[0].as_double
    assert mfu == pytest.approx(2 * 4e11 / 1.5 / 1e12)  # two steps' FLOPs over 1.5 s
    rejected = metrics["mfuscope_reports_rejected"].sum.data_points
    assert {p.attributes[0].value.string_value for p in rejected} >= {"invalid", "too_large"}
