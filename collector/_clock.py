"""The collector's clock, injected so tests drive time instead of sleeping."""

from __future__ import annotations

import time
from typing import Protocol

__all__ = ["Clock", "SystemClock"]


class Clock(Protocol):
    """`monotonic()` in seconds for ages, expiry and rate limits; `time_ns()` in Unix nanoseconds
    for the start times of exported series."""

    def monotonic(self) -> float: ...

    def time_ns(self) -> int: ...


class SystemClock:
    """The real clocks: `time.monotonic` and `time.time_ns`."""

    def monotonic(self) -> float:
        return time.monotonic()

    def time_ns(self) -> int:
        return time.time_ns()
