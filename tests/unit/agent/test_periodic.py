"""The agent's periodic thread: adaptive intervals, tasks run when due or woken, a failing task
logged and run again while the others go on, all ended by `stop`."""

from __future__ import annotations

import logging
import threading
import time

import pytest
from mfuscope.agent import _periodic
from mfuscope.agent._health import RateLimitedLog
from mfuscope.agent._periodic import Periodic, adaptive_interval_s

WAIT_S = 30.0  # a bound on a broken scheduler, never reached when it works


@pytest.mark.parametrize(
    ("written", "elapsed_s", "expected"),
    [
        (0, 1.0, 0.1),  # nothing written: the longest pause
        (10, 0.0, 0.1),  # no time passed: no rate to go by
        (1000, 1.0, 0.1),  # a quarter of the ring lasts 1 s at this rate: the longest pause
        (40_960, 1.0, 0.025),  # a quarter of 4096 at 40,960 per second
        (10**9, 1.0, 0.005),  # never shorter than the shortest pause
    ],
)
def test_adaptive_interval(written: int, elapsed_s: float, expected: float) -> None:
    pause = adaptive_interval_s(written, elapsed_s, 4096, max_s=0.1, min_s=0.005, share=0.25)
    assert pause == pytest.approx(expected)


def test_a_failing_task_is_logged_and_runs_again_while_the_others_go_on(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(_periodic, "_AFTER_FAILURE_S", 0.0)
    periodic = Periodic(RateLimitedLog(60.0), name="test-periodic-failing", clock=time.monotonic)
    calls: list[str] = []
    again, other = threading.Event(), threading.Event()

    def failing() -> float | None:
        calls.append("failing")
        if len([c for c in calls if c == "failing"]) < 3:
            raise RuntimeError("task bug")
        again.set()
        return None  # done: never runs again

    def fine() -> float | None:
        calls.append("fine")
        other.set()
        return 3600.0

    with caplog.at_level(logging.WARNING, logger="mfuscope.agent"):
        periodic.add("failing", failing)
        periodic.add("fine", fine)
        assert again.wait(WAIT_S) and other.wait(WAIT_S)
        periodic.stop(WAIT_S)
    assert calls.count("failing") == 3 and calls.count("fine") == 1
    logged = [r.getMessage() for r in caplog.records if "task bug" in r.getMessage()]
    assert logged == ["mfuscope: agent error in failing: RuntimeError('task bug')"]
    # the thread ran the tasks, and stop ended it
    assert "test-periodic-failing" not in {t.name for t in threading.enumerate()}


def test_a_woken_task_runs_before_it_is_due_and_a_removed_one_never() -> None:
    periodic = Periodic(RateLimitedLog(60.0), clock=time.monotonic)
    ran = threading.Event()
    removed_ran: list[int] = []
    task = periodic.add("later", lambda: (ran.set(), 3600.0)[1], delay_s=3600.0)
    gone = periodic.add("gone", lambda: (removed_ran.append(1), 0.0)[1], delay_s=3600.0)
    periodic.remove(gone)
    periodic.wake(gone)  # waking a removed task does not bring it back
    periodic.wake(task)
    assert ran.wait(WAIT_S)
    periodic.stop(WAIT_S)
    assert removed_ran == []
