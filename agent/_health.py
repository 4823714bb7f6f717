"""Thread-safe health counters and rate-limited logging shared by the agent's parts.

Telemetry catches its own failures, counts them and logs at most once per interval per kind
(STYLE "Shells"): a collector that is down for an hour must not write a line per step.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from mfuscope.core.schema import AgentHealth

__all__ = ["LOGGER", "HealthCounters", "RateLimitedLog"]

LOGGER = logging.getLogger("mfuscope.agent")


class HealthCounters:
    """Cumulative, monotonic counters of one agent process (the schema's `AgentHealth`)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._reports_dropped = 0
        self._send_failures = 0
        self._profiler_failures = 0
        self._windows_analysed = 0
        self._internal_errors = 0

    def add_dropped(self, count: int = 1) -> None:
        with self._lock:
            self._reports_dropped += count

    def add_send_failure(self) -> None:
        with self._lock:
            self._send_failures += 1

    def add_profiler_failure(self) -> None:
        with self._lock:
            self._profiler_failures += 1

    def add_window_analysed(self) -> None:
        with self._lock:
            self._windows_analysed += 1

    def add_internal_error(self) -> None:
        with self._lock:
            self._internal_errors += 1

    @property
    def internal_errors(self) -> int:
        """Agent bugs caught on the training thread (not in the wire schema; logged)."""
        with self._lock:
            return self._internal_errors

    def snapshot(self) -> AgentHealth:
        with self._lock:
            return AgentHealth(
                reports_dropped_total=self._reports_dropped,
                send_failures_total=self._send_failures,
                profiler_failures_total=self._profiler_failures,
                windows_analysed_total=self._windows_analysed,
            )


class RateLimitedLog:
    """Logs each `kind` of message at most once per `interval_s` (clock: monotonic seconds).

    Messages suppressed in between are counted and the count is appended to the next line.
    """

    def __init__(
        self,
        interval_s: float,
        *,
        logger: logging.Logger = LOGGER,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if interval_s < 0:
            raise ValueError(f"interval_s must be >= 0, got {interval_s}")
        self._interval_s = interval_s
        self._logger = logger
        self._clock = clock
        self._lock = threading.Lock()
        self._last: dict[str, float] = {}
        self._suppressed: dict[str, int] = {}

    @property
    def logger(self) -> logging.Logger:
        """Where the lines go (for lines that are not rate-limited)."""
        return self._logger

    def log(self, level: int, kind: str, message: str, *args: object) -> bool:
        """Log `message % args` under `kind` unless that kind was logged within the interval.

        Returns whether a line was written. Never raises.
        """
        now = self._clock()
        with self._lock:
            last = self._last.get(kind)
            if last is not None and now - last < self._interval_s:
                self._suppressed[kind] = self._suppressed.get(kind, 0) + 1
                return False
            self._last[kind] = now
            suppressed = self._suppressed.pop(kind, 0)
        try:
            if suppressed:
                message += f" ({suppressed} similar messages suppressed)"
            self._logger.log(level, message, *args)
        except Exception:  # a broken handler must not reach the training loop
            return False
        return True

    def warning(self, kind: str, message: str, *args: object) -> bool:
        return self.log(logging.WARNING, kind, message, *args)

    def info(self, kind: str, message: str, *args: object) -> bool:
        return self.log(logging.INFO, kind, message, *args)
