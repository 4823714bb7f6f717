"""Waiting for what another thread does: on a condition, with a deadline that only catches a hang.

A test that starts a real thread (a periodic thread, a transport, an analyser) waits for the
outcome it asserts, never for a fixed time: `wait_until` returns as soon as the condition holds
and fails, naming what never happened, only past a deadline far beyond any load. It polls
through `threading.Event.wait`, not `time.sleep`, which tests not marked slow may not call
(`tests/support/fast_tier.py`): a sleep is a guess at how long something takes.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

__all__ = ["HANG_S", "wait_until"]

# Far beyond what any wait of the suite takes under load: reaching it means the thing never came.
HANG_S = 60.0


def wait_until(condition: Callable[[], object], what: str, timeout_s: float = HANG_S) -> None:
    """Return once `condition()` is true; fail the test saying `what` never happened after
    `timeout_s` seconds. Polls every millisecond at first, backing off to 50 ms."""
    pause = threading.Event()  # never set: its wait is a pause the fast tier allows
    deadline = time.monotonic() + timeout_s
    interval_s = 0.001
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s:.0f} s waiting for {what}")
        pause.wait(interval_s)
        interval_s = min(2 * interval_s, 0.05)
