"""A real `mfuscope collector` process on port 0: good and bad batches over HTTP, duplicates,
token auth, rate limits, expiry, exposition identical to the in-process golden path, shutdown."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from mfuscope.collector import Aggregator, StateConfig
from mfuscope.collector._routes import HttpRequest, Routes

from tests.support.collector_fakes import FakeClock, batch_dict, report_dict
from tests.support.collector_process import CollectorProcess, post, request

pytestmark = pytest.mark.slow


@pytest.fixture
def start(tmp_path: Path) -> Iterator[Any]:
    started: list[CollectorProcess] = []

    def _start(*args: str, env: dict[str, str] | None = None) -> CollectorProcess:
        process = CollectorProcess(tmp_path, *args, env=env)
        started.append(process)
        return process

    yield _start
    for process in started:
        process.stop()


def metric_lines(url: str) -> list[str]:
    status, _, body = request(url + "/metrics")
    assert status == 200
    return body.decode().splitlines()


def test_good_batches_duplicates_and_gzip(start: Any) -> None:
    collector = start()
    assert post(collector.url, batch_dict(rank=0, steps=[1, 2])) == (
        200,
        {"accepted": 2, "duplicates": 0},
    )
    gz = gzip.compress(json.dumps(batch_dict(rank=1, steps=[1, 2, 3])).encode())
    headers = {"Content-Encoding": "gzip", "Content-Type": "application/json"}
    assert post(collector.url, gz, **headers) == (200, {"accepted": 3, "duplicates": 0})
    assert post(collector.url, batch_dict(rank=0, steps=[2, 3])) == (
        200,
        {"accepted": 1, "duplicates": 1},
    )
    lines = metric_lines(collector.url)
    assert 'mfuscope_steps_total{job="job-a"} 6.0' in lines
    assert 'mfuscope_reports_duplicate_total{job="job-a"} 1.0' in lines
    assert 'mfuscope_ranks{job="job-a"} 2.0' in lines
    status, _, body = request(collector.url + "/v1/summary")
    summary = json.loads(body)
    assert status == 200 and summary["jobs"][0]["steps_total"] == 6
    assert request(collector.url + "/healthz")[:1] == (200,)


def _nan_body() -> bytes:
    batch = batch_dict(steps=[1])
    batch["reports"][0]["wall_s"] = float("nan")
    return json.dumps(batch).encode()  # Python writes the non-standard literal NaN


def _components_off() -> dict[str, Any]:
    batch = batch_dict(steps=[1])
    batch["reports"][0]["components"][0]["seconds"] = 0.1
    return batch


BAD_INPUTS = [
    ("not json", b"{oops", {}, 400, "body", "invalid"),
    ("unknown major version", batch_dict(version="2.0"), {}, 400, "version", "version"),
    ("missing field", {k: v for k, v in batch_dict().items() if k != "host"}, {}, 400, "host",
     "invalid"),
    ("mistyped field", batch_dict(world_size="2"), {}, 400, "world_size", "invalid"),
    ("negative duration", batch_dict(reports=[report_dict(1, wall_s=-1.0)]), {}, 400,
     "reports[0].wall_s", "invalid"),
    ("NaN duration", _nan_body(), {}, 400, "reports[0].wall_s", "invalid"),
    ("buckets not summing to the step", _components_off(), {}, 400, "reports[0].components",
     "invalid"),
    ("absurd size", batch_dict(world_size=1 << 40), {}, 400, "world_size", "invalid"),
    ("bad gzip", b"\x1f\x8b garbage", {"Content-Encoding": "gzip"}, 400, "body", "invalid"),
    ("gzip bomb", gzip.compress(b"0" * (2 << 20)), {"Content-Encoding": "gzip"}, 413, "body",
     "too_large"),
    ("body over the limit", b" " * ((1 << 20) + 1), {}, 413, "body", "too_large"),
]  # fmt: skip


def test_every_bad_input_class_is_refused_and_counted(start: Any) -> None:
    collector = start("--max-body-bytes", str(1 << 20))
    assert post(collector.url, batch_dict(job="kept", steps=[1]))[0] == 200
    before = [line for line in metric_lines(collector.url) if "last_report_age" not in line]
    reasons: dict[str, int] = {}
    for name, body, headers, status, field, reason in BAD_INPUTS:
        got_status, payload = post(collector.url, body, **headers)
        assert (got_status, payload["field"]) == (status, field), name
        assert payload["error"], name
        reasons[reason] = reasons.get(reason, 0) + 1
    lines = metric_lines(collector.url)
    for reason, count in reasons.items():
        assert f'mfuscope_reports_rejected_total{{reason="{reason}"}} {count:.1f}' in lines
    after = [
        line
        for line in lines
        if "last_report_age" not in line and "mfuscope_reports_rejected_total" not in line
    ]
    assert after == [line for line in before if "mfuscope_reports_rejected_total" not in line]
    assert request(collector.url + "/nope")[0] == 404
    assert request(collector.url + "/v1/reports")[0] == 405


def test_bearer_token(start: Any, tmp_path: Path) -> None:
    token_file = tmp_path / "token"
    token_file.write_text("tok-123\n")
    collector = start("--token-file", str(token_file))
    assert post(collector.url, batch_dict())[0] == 401
    assert post(collector.url, batch_dict(), Authorization="Bearer nope")[0] == 401
    assert post(collector.url, batch_dict(), Authorization="Bearer tok-123")[0] == 200
    assert 'mfuscope_reports_rejected_total{reason="unauthorized"} 2.0' in metric_lines(
        collector.url
    )
    assert request(collector.url + "/metrics")[0] == 200  # scrapes need no token


def test_a_token_is_required_beyond_loopback() -> None:
    cmd = [sys.executable, "-m", "mfuscope.cli", "collector", "--listen", "0.0.0.0:0"]
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    assert "requires a token" in result.stderr


def test_rate_limit(start: Any) -> None:
    collector = start("--rate-limit", "0.01", "--rate-burst", "2")
    statuses = [post(collector.url, batch_dict(steps=[s]))[0] for s in (1, 2, 3)]
    assert statuses == [200, 200, 429]
    status, headers, _ = request(collector.url + "/v1/reports", json.dumps(batch_dict()).encode())
    assert status == 429 and int(headers["Retry-After"]) >= 1


def test_silent_ranks_expire_and_their_series_disappear(start: Any) -> None:
    collector = start("--expire-after", "0.5", "--per-rank-labels")
    assert post(collector.url, batch_dict(job="brief", steps=[1]))[0] == 200
    assert 'mfuscope_steps_total{job="brief",rank="0"} 1.0' in metric_lines(collector.url)
    deadline = time.monotonic() + 20
    while any("brief" in line for line in metric_lines(collector.url)):
        assert time.monotonic() < deadline, "series did not expire"
        time.sleep(0.1)
    summary = json.loads(request(collector.url + "/v1/summary")[2])
    assert summary["jobs"] == []


def test_exposition_matches_the_in_process_golden_path(start: Any) -> None:
    bodies = [
        batch_dict(job="train", rank=0, steps=[1, 2], health={"reports_dropped_total": 3}),
        batch_dict(job="train", rank=1, reports=[report_dict(1, wall_s=2.0)]),
    ]
    collector = start()
    for body in bodies:
        assert post(collector.url, body)[0] == 200
    local = Aggregator(StateConfig(), clock=FakeClock())
    for body in bodies:
        local.ingest(json.dumps(body).encode())
    expected = Routes(local).handle(HttpRequest("GET", "/metrics", "x"), b"").body.decode()

    def stable(lines: list[str]) -> list[str]:
        return [line for line in lines if not line.startswith("mfuscope_last_report_age")]

    assert stable(metric_lines(collector.url)) == stable(expected.splitlines())


def test_sigterm_is_a_clean_exit(start: Any) -> None:
    collector = start()
    code, out, err = collector.stop()
    assert code == 0, err
    assert out.startswith("mfuscope collector listening on http://127.0.0.1:")
