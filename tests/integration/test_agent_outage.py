"""The agent's transport through a collector outage: the collector process is killed mid-run and
comes back on the same port; every report produced meanwhile (far fewer than the buffer holds)
arrives, none is dropped, and the restarted collector counts exactly what it was sent.

The outage outlasts the retry backoff's climb to its cap (delays 0.5, 1, 2, 2, ... s) by several
capped retries, so a transport that gave a batch up after a few attempts, or stopped retrying at
the cap, would lose reports here."""

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

REPORTS_PER_S = 20.0
# Backoff capped at 2 s (the default cap is 10 s): the test then ends about 2 s after the
# collector is back instead of up to 10 s.
RETRY = RetryPolicy(base_s=0.5, max_s=2.0, request_timeout_s=2.0)
# Failed attempts the outage must at least see: 3 to climb to the cap (after 0.5 + 1 + 2 s),
# then 2 more after capped delays.
MIN_FAILED_ATTEMPTS = 5
# Long enough for those attempts (0.5 + 1 + 2 + 2 = 5.5 s after the first one, which comes
# within a flush interval of the kill) with room for a busy machine's late wake-ups.
OUTAGE_S = 9.0


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


def test_no_report_is_lost_while_the_collector_is_down_past_the_backoff_cap(tmp_path: Path) -> None:
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
        time.sleep(1.0)  # two flush intervals: batches delivered, and more on their way
        first.kill()  # mid-run: batches are in flight or about to be
        sink.phase = 2
        time.sleep(OUTAGE_S)
        second = CollectorProcess(tmp_path, listen=first.address)
        time.sleep(1.0)  # reports made after the restart too; `close` sends what is left
        stop.set()
        producer.join()
        assert transport.close(15.0) is True
        lost = set(submitted) - {step for _, step in sink.delivered}
        assert lost == set(), f"{len(lost)} of {len(submitted)} reports lost"
        assert transport.dropped_reports == 0
        assert health.snapshot().reports_dropped_total == 0
        # The outage was real, and long enough for retries at the backoff's cap.
        assert health.snapshot().send_failures_total >= MIN_FAILED_ATTEMPTS
        after_restart = {step for phase, step in sink.delivered if phase == 2}
        assert len(after_restart) > OUTAGE_S * REPORTS_PER_S * 0.5
        assert _steps_total(second.url) == len(after_restart)
    finally:
        stop.set()
        producer.join()
        first.stop()
        if second is not None:
            second.stop()
