"""Ships step reports off the training thread: bounded buffer, batching, retries, clean close.

The agent's periodic thread (at close, the closing thread) calls `submit` (a lock and a deque
append, never blocking on I/O); the training thread never calls into a transport. A
daemon thread takes up to `max_batch_reports` reports at a time (or whatever accumulated within
`flush_interval_s`), encodes them with the caller's `encode` (which stamps the batch header and
the current health counters), and hands the bytes to a `Sink`.

A batch whose send fails (retryably) stays in the buffer: it is retried with capped exponential
backoff (longer when the collector asks so with ``Retry-After``) for as long as the buffer has
room, so an outage loses nothing until the buffer is full. The batch in flight counts against the
buffer; when a new report would overflow it, the *oldest* report goes (a live view wants the
newest data), counted as dropped. `RetryPolicy.max_attempts` can bound the attempts per batch
instead. A refusal that cannot get better (HTTP 400/401/413) drops the batch at once, counted.
Re-sent reports are safe: `(job, rank, step)` is the collector's idempotency key.

With `heartbeat_s` set, a batch without reports goes out whenever nothing was sent for that long
(its header carries the rank's status, e.g. the collective it is blocked in, while no step
completes); `request_status` asks for one at once (the agent does at close). A status batch is
sent once, never retried: the next one supersedes it.
"""

from __future__ import annotations

import collections
import contextlib
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from mfuscope.agent._health import HealthCounters, RateLimitedLog
from mfuscope.agent._sinks import SendError, Sink
from mfuscope.core.schema import StepReport

__all__ = ["RetryPolicy", "Transport", "backoff_delay_s"]


@dataclass(frozen=True)
class RetryPolicy:
    """How patiently to re-send one batch (seconds). `max_attempts` None: retry for as long as
    the buffer has room; `max_s` caps every delay, also one the collector asks for with
    ``Retry-After``; `request_timeout_s` is the whole deadline of one send attempt."""

    max_attempts: int | None = None
    base_s: float = 0.5
    max_s: float = 10.0
    request_timeout_s: float = 5.0

    def __post_init__(self) -> None:
        if self.max_attempts is not None and self.max_attempts < 1:
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
        heartbeat_s: float | None = None,
    ) -> None:
        if max_queue_reports < 1 or max_batch_reports < 1:
            raise ValueError("max_queue_reports and max_batch_reports must be >= 1")
        if max_queue_reports < max_batch_reports:
            log.warning(
                "transport-small-buffer",
                "mfuscope: the report buffer for %s holds %d reports, fewer than one batch (%d, "
                "sent at least every %g s): a collector outage of one flush interval will drop "
                "reports; raise max_queue_reports to %d or more",
                sink.describe(),
                max_queue_reports,
                max_batch_reports,
                flush_interval_s,
                max_batch_reports,
            )
        self._sink = sink
        self._encode = encode
        self._health = health
        self._log = log
        self._max_queue = max_queue_reports
        # A batch is due once this many reports wait: never more than the buffer holds.
        self._max_batch = min(max_batch_reports, max_queue_reports)
        self._flush_interval_s = flush_interval_s
        self._retry = retry or RetryPolicy()
        self._clock = clock
        self._cond = threading.Condition()
        self._queue: collections.deque[StepReport] = collections.deque()
        # Reports taken by the sender and not yet delivered or dropped (the oldest ones). While
        # the sender waits between attempts, `submit` may drop from its front.
        self._batch: list[StepReport] = []
        self._sending = False  # an attempt is on the wire: its body already holds `_batch`
        self._closing = False
        self._deadline = float("inf")
        self._abandoned = False
        self._dropped = 0
        self._heartbeat_s = heartbeat_s
        self._last_sent = clock()
        self._status_wanted = False
        self._status_batch = False  # the batch being sent is a status batch (no reports)
        self._thread = threading.Thread(
            target=self._run, name=f"mfuscope-transport({sink.describe()})", daemon=True
        )
        self._thread.start()

    # --- the reporting thread (the agent's periodic thread; at close, the closing thread) ------

    def submit(self, report: StepReport) -> None:
        """Queue one report. Never blocks on I/O; drops (and counts) the oldest when full."""
        dropped = 0
        with self._cond:
            if self._closing:
                dropped = 1
            else:
                self._queue.append(report)
                if len(self._queue) + len(self._batch) > self._max_queue:
                    if self._batch and not self._sending:
                        del self._batch[0]
                    else:
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

    def request_status(self) -> None:
        """Send a status batch (no reports) as soon as the queue is empty, even while closing.
        Only a transport with `heartbeat_s` sends status batches."""
        if self._heartbeat_s is None:
            return
        with self._cond:
            self._status_wanted = True
            self._cond.notify()

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
            leftover = len(self._queue) + len(self._batch)
            self._queue.clear()
            self._batch = []
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
        """Wait for a full batch, the flush interval since the oldest report, a status batch
        (empty: see `heartbeat_s`), or close.

        Returns None when the transport is closed and empty (or abandoned).
        """
        with self._cond:
            first_seen: float | None = None
            while True:
                if self._abandoned:
                    return None
                if not self._queue:
                    first_seen = None
                    wait_s = self._status_wait_s()
                    if wait_s <= 0:
                        self._status_wanted = False
                        self._status_batch = True
                        self._batch = []
                        return []
                    if self._closing:
                        return None
                    self._cond.wait(None if wait_s == float("inf") else wait_s)
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
            self._batch = [self._queue.popleft() for _ in range(count)]
            self._status_batch = False
            return list(self._batch)

    def _status_wait_s(self) -> float:
        """Seconds until a status batch is due (<= 0: now; inf: never). Caller holds the lock."""
        if self._status_wanted:
            return 0.0
        if self._heartbeat_s is None or self._closing:
            return float("inf")
        return self._last_sent + self._heartbeat_s - self._clock()

    def _run(self) -> None:
        while True:
            try:
                if self._take_batch() is None:
                    return
                delivered = self._send_with_retries()
            except Exception as exc:  # never let the sender die silently
                self._log.warning("transport-bug", "mfuscope: transport error: %r", exc)
                delivered = 0
            with self._cond:
                if self._abandoned:
                    return
                if delivered or self._status_batch:  # a failed status batch is not retried
                    self._last_sent = self._clock()
                lost = max(len(self._batch) - delivered, 0)
                self._batch = []
                self._sending = False
                self._status_batch = False
            if lost:
                self._count_dropped(lost)

    def _attempt(self) -> tuple[list[StepReport], float]:
        """The reports to send now (what is left of the batch) and the time left before close."""
        with self._cond:
            self._sending = bool(self._batch)
            return list(self._batch), self._deadline - self._clock()

    def _send_with_retries(self) -> int:
        """Send the current batch until it arrives; returns how many of its reports arrived (0:
        the batch is given up, all of it dropped by `submit` meanwhile, or the close deadline
        passed). A status batch gets one attempt."""
        body, encoded = b"", -1
        attempt = 0
        status = self._status_batch
        while True:
            attempt += 1
            batch, remaining = self._attempt()
            if (not batch and not status) or remaining <= 0:
                return 0
            if len(batch) != encoded:  # `submit` dropped the oldest while we waited: re-encode
                body, encoded = self._encode(batch), len(batch)
            try:
                self._sink.send(body, min(self._retry.request_timeout_s, remaining))
                return len(batch)
            except SendError as exc:
                self._health.add_send_failure()
                if status:
                    return 0
                limit = self._retry.max_attempts
                self._log.warning(
                    "send-failed",
                    "mfuscope: sending %d reports to %s failed (attempt %d%s): %s",
                    len(batch),
                    self._sink.describe(),
                    attempt,
                    "" if limit is None else f" of {limit}",
                    exc,
                )
                if not exc.retryable or (limit is not None and attempt >= limit):
                    return 0
                delay = backoff_delay_s(attempt, self._retry.base_s, self._retry.max_s)
                if exc.retry_after_s is not None:
                    delay = min(self._retry.max_s, max(delay, exc.retry_after_s))
            if not self._wait(delay):
                return 0

    def _wait(self, delay_s: float) -> bool:
        """Sleep `delay_s` between attempts (`submit` may trim the batch meanwhile); False if the
        transport was abandoned."""
        with self._cond:
            self._sending = False
            wake = self._clock() + delay_s
            while not self._abandoned and self._clock() < min(wake, self._deadline):
                self._cond.wait(min(wake, self._deadline) - self._clock())
            return not self._abandoned
