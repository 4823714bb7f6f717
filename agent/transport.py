"""Ships step reports off the training thread: bounded buffer, batching, retries, clean close.

The training thread only calls `submit` (a lock and a deque append, never blocking on I/O). A
daemon thread takes up to `max_batch_reports` reports at a time (or whatever accumulated within
`flush_interval_s`), encodes them with the caller's `encode` (which stamps the batch header and
the current health counters), and hands the bytes to a `Sink`. A failed send is retried with
exponential backoff up to `max_send_attempts`; then the batch is dropped and counted. When the
buffer is full the *oldest* report is dropped (a live view wants the newest data) and counted.
Re-sent reports are safe: `(job, rank, step)` is the collector's idempotency key.
"""

from __future__ import annotations

import collections
import contextlib
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from mfuscope.agent._health import HealthCounters, RateLimitedLog
from mfuscope.agent.sinks import SendError, Sink
from mfuscope.core.schema import StepReport

__all__ = ["RetryPolicy", "Transport", "backoff_delay_s"]


@dataclass(frozen=True)
class RetryPolicy:
    """How often and how patiently to re-send one batch (seconds)."""

    max_attempts: int = 5
    base_s: float = 0.5
    max_s: float = 30.0
    request_timeout_s: float = 5.0

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise ValueError(f"max_attempts must be >= 1, got {self.max_attempts}")
        if self.base_s < 0 or self.max_s < 0 or self.request_timeout_s <= 0:
            raise ValueError("retry delays must be >= 0 and request_timeout_s > 0")


def backoff_delay_s(attempt: int, base_s: float, max_s: float) -> float:
    """Delay before retry number `attempt` (1 = first retry): ``min(max_s, base_s * 2**(a-1))``.

    Deterministic (no jitter): ranks fail at different moments anyway, and a deterministic delay
    keeps the behaviour testable.
    """
    if attempt < 1:
        raise ValueError(f"attempt must be >= 1, got {attempt}")
    return float(min(max_s, base_s * 2.0 ** min(attempt - 1, 60)))


class Transport:
    """A bounded report buffer drained by one background sender thread into one `Sink`."""

    def __init__(
        self,
        sink: Sink,
        encode: Callable[[Sequence[StepReport]], bytes],
        health: HealthCounters,
        log: RateLimitedLog,
        *,
        max_queue_reports: int = 10_000,
        max_batch_reports: int = 256,
        flush_interval_s: float = 5.0,
        retry: RetryPolicy | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if max_queue_reports < 1 or max_batch_reports < 1:
            raise ValueError("max_queue_reports and max_batch_reports must be >= 1")
        self._sink = sink
        self._encode = encode
        self._health = health
        self._log = log
        self._max_queue = max_queue_reports
        self._max_batch = max_batch_reports
        self._flush_interval_s = flush_interval_s
        self._retry = retry or RetryPolicy()
        self._clock = clock
        self._cond = threading.Condition()
        self._queue: collections.deque[StepReport] = collections.deque()
        self._in_flight = 0  # reports taken by the sender and not yet delivered or dropped
        self._closing = False
        self._deadline = float("inf")
        self._abandoned = False
        self._dropped = 0
        self._thread = threading.Thread(
            target=self._run, name=f"mfuscope-transport({sink.describe()})", daemon=True
        )
        self._thread.start()

    # --- training thread ---------------------------------------------------------------------

    def submit(self, report: StepReport) -> None:
        """Queue one report. Never blocks on I/O; drops (and counts) the oldest when full."""
        dropped = 0
        with self._cond:
            if self._closing:
                dropped = 1
            else:
                self._queue.append(report)
                if len(self._queue) > self._max_queue:
                    self._queue.popleft()
                    dropped = 1
                if len(self._queue) == 1 or len(self._queue) >= self._max_batch:
                    self._cond.notify()
        if dropped:
            self._count_dropped(dropped)
            self._log.warning(
                "transport-full",
                "mfuscope: report buffer for %s full or closed; dropping reports",
                self._sink.describe(),
            )

    def _count_dropped(self, count: int) -> None:
        with self._cond:
            self._dropped += count
        self._health.add_dropped(count)

    @property
    def dropped_reports(self) -> int:
        """Reports this transport dropped (buffer full, failed sends, close deadline)."""
        with self._cond:
            return self._dropped

    def close(self, timeout_s: float) -> bool:
        """Send what is queued within `timeout_s`, then stop.

        Returns True if everything queued at close got out. Reports still queued at the
        deadline are dropped and counted.
        """
        with self._cond:
            dropped_before = self._dropped
            if not self._closing:
                self._closing = True
                self._deadline = self._clock() + max(timeout_s, 0.0)
            self._cond.notify_all()
        self._thread.join(max(timeout_s, 0.0) + 0.05)
        with self._cond:
            self._abandoned = True
            leftover = len(self._queue) + self._in_flight
            self._queue.clear()
            self._in_flight = 0
        if leftover:
            self._count_dropped(leftover)
            self._log.warning(
                "transport-close",
                "mfuscope: %d reports for %s not delivered before close timeout",
                leftover,
                self._sink.describe(),
            )
        with contextlib.suppress(Exception):
            self._sink.close()
        return self.dropped_reports == dropped_before

    # --- sender thread -----------------------------------------------------------------------

    def _take_batch(self) -> list[StepReport] | None:
        """Wait for a full batch, the flush interval since the oldest report, or close.

        Returns None when the transport is closed and empty (or abandoned).
        """
        with self._cond:
            first_seen: float | None = None
            while True:
                if self._abandoned:
                    return None
                if not self._queue:
                    first_seen = None
                    if self._closing:
                        return None
                    self._cond.wait()
                    continue
                now = self._clock()
                if first_seen is None:
                    first_seen = now
                due = first_seen + self._flush_interval_s
                full = len(self._queue) >= self._max_batch
                if full or self._closing or now >= due:
                    break
                self._cond.wait(due - now)
            count = min(len(self._queue), self._max_batch)
            batch = [self._queue.popleft() for _ in range(count)]
            self._in_flight = count
            return batch

    def _run(self) -> None:
        while True:
            try:
                batch = self._take_batch()
                if batch is None:
                    return
                delivered = self._send_with_retries(batch)
            except Exception as exc:  # never let the sender die silently
                self._log.warning("transport-bug", "mfuscope: transport error: %r", exc)
                delivered = False
            with self._cond:
                if self._abandoned:
                    return
                lost = 0 if delivered else self._in_flight
                self._in_flight = 0
            if lost:
                self._count_dropped(lost)

    def _remaining_s(self) -> float:
        with self._cond:
            return self._deadline - self._clock()

    def _send_with_retries(self, batch: list[StepReport]) -> bool:
        body = self._encode(batch)
        for attempt in range(1, self._retry.max_attempts + 1):
            remaining = self._remaining_s()
            if remaining <= 0:
                return False
            try:
                self._sink.send(body, min(self._retry.request_timeout_s, remaining))
                return True
            except SendError as exc:
                self._health.add_send_failure()
                self._log.warning(
                    "send-failed",
                    "mfuscope: sending %d reports to %s failed (attempt %d of %d): %s",
                    len(batch),
                    self._sink.describe(),
                    attempt,
                    self._retry.max_attempts,
                    exc,
                )
                if not exc.retryable or attempt == self._retry.max_attempts:
                    return False
            delay = backoff_delay_s(attempt, self._retry.base_s, self._retry.max_s)
            with self._cond:
                wake = self._clock() + delay
                while not self._abandoned and self._clock() < min(wake, self._deadline):
                    self._cond.wait(min(wake, self._deadline) - self._clock())
                if self._abandoned:
                    return False
        return False
