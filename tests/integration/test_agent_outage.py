"""The agent's transport through a collector outage: the collector process is killed mid-run and
comes back on the same port; every report produced meanwhile (far fewer than the buffer holds)
arrives, none is dropped, and the restarted collector counts exactly what it was sent."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Sequence
from pathlib import Path

import pytest
from mfuscope.agent._health import HealthCounters, RateLimitedLog
from mfuscope.agent._sinks import HttpSink
from mfuscope.agent._transport import RetryPolicy, Transport
from mfuscope.core.schema import StepReport

from tests.support.collector_fakes import batch_dict, report_dict
from tests.support.collector_process import CollectorProcess, request

pytestmark = pytest.mark.slow

OUTAGE_S = 30.0
REPORTS_PER_S = 20.0
# Backoff capped at 2 s (the default cap is 10 s): the test then ends about 2 s after the
# collector is back instead of up to 10 s.
RETRY = RetryPolicy(base_s=0.5, max_s=2.0, request_timeout_s=2.0)


class RecordingSink(HttpSink):
    """An `HttpSink` that records the steps of every batch the collector acknowledged, and
    which collector incarnation (`phase`) acknowledged it."""

    def __init__(self, url: str) -> None:
        super().__init__(url)
        self.phase = 1
        self.delivered: list[tuple[int, int]] = []  # (phase, step)

    def send(self, body: bytes, timeout_s: float) -> None:
        phase = self.phase
        super().send(body, timeout_s)
        self.delivered.extend((phase, r["step"]) for r in json.loads(body)["reports"])


def _encode(reports: Sequence[StepReport]) -> bytes:
    wire = [report_dict(r.step) for r in reports]
    return json.dumps(batch_dict(job="outage", world_size=1, reports=wire)).encode()


def _steps_total(url: str) -> int:
    status, _, body = request(url + "/v1/summary")
    assert status == 200
    jobs = json.loads(body)["jobs"]
    return int(jobs[0]["steps_total"]) if jobs else 0


def test_no_report_is_lost_when_the_collector_is_down_for_30_s(tmp_path: Path) -> None:
    first = CollectorProcess(tmp_path)
    sink = RecordingSink(first.url)
    health = HealthCounters()
    transport = Transport(
        sink,
        _encode,
        health,
        RateLimitedLog(60.0),
        max_queue_reports=10_000,
        max_batch_reports=64,
        flush_interval_s=0.5,
        retry=RETRY,
    )
    submitted: list[int] = []
    stop = threading.Event()

    def produce() -> None:
        step = 0
        while not stop.wait(1.0 / REPORTS_PER_S):
            step += 1
            transport.submit(
                StepReport(
                    step=step,
                    start_unix_ns=time.time_ns(),
                    wall_s=0.05,
                    model_flops=1e9,
                    recompute_flops=0.0,
                )
            )
            submitted.append(step)

    producer = threading.Thread(target=produce)
    producer.start()
    second: CollectorProcess | None = None
    try:
        time.sleep(2.0)
        first.kill()  # mid-run: batches are in flight or about to be
        sink.phase = 2
        time.sleep(OUTAGE_S)
        second = CollectorProcess(tmp_path, listen=first.address)
        time.sleep(2.0)
        stop.set()
        producer.join()
        assert transport.close(15.0) is True
        lost = set(submitted) - {step for _, step in sink.delivered}
        assert lost == set(), f"{len(lost)} of {len(submitted)} reports lost"
        assert transport.dropped_reports == 0
        assert health.snapshot().reports_dropped_total == 0
        assert health.snapshot().send_failures_total > 0  # the outage was real
        after_restart = {step for phase, step in sink.delivered if phase == 2}
        assert len(after_restart) > OUTAGE_S * REPORTS_PER_S * 0.5
        assert _steps_total(second.url) == len(after_restart)
    finally:
        stop.set()
        producer.join()
        first.stop()
        if second is not None:
            second.stop()
