"""The collector's aggregation core: the thread-safe facade the HTTP layer and the exporters share.

One lock around the aggregation state, an injected clock, and rejection counts by reason. A
request body is decoded and validated whole by `ingest.decode_batch` before the state is touched,
so a bad batch changes nothing.
"""

from __future__ import annotations

import threading

from mfuscope.collector._clock import Clock, SystemClock
from mfuscope.collector._errors import IngestError, OverLimit
from mfuscope.collector._ingest import DEFAULT_MAX_BODY_BYTES, decode_batch
from mfuscope.collector._series import metric_families
from mfuscope.collector._snapshot import CollectorSnapshot
from mfuscope.collector._snapshot_builder import build_snapshot
from mfuscope.collector._state import AggregationState, IngestResult, StateConfig
from mfuscope.core.schema import ReportBatch
from mfuscope.exporters.model import MetricFamily

__all__ = ["Aggregator"]


class Aggregator:
    """The collector process's aggregation core, thread-safe: `ingest` request bodies, `snapshot`
    for the views, `families` for the exporters. Every method takes the lock briefly; rendering
    happens on the immutable snapshot outside it."""

    def __init__(
        self,
        config: StateConfig | None = None,
        *,
        clock: Clock | None = None,
        max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    ) -> None:
        if max_body_bytes < 1:
            raise ValueError(f"max_body_bytes must be >= 1, got {max_body_bytes}")
        self._state = AggregationState(config)
        self._clock: Clock = clock or SystemClock()
        self._lock = threading.Lock()
        self.max_body_bytes = max_body_bytes

    @property
    def config(self) -> StateConfig:
        return self._state.config

    def ingest(self, body: bytes, *, content_encoding: str = "") -> IngestResult:
        """Decode, validate and apply one batch. Raises `IngestError` (and counts it)."""
        try:
            batch = decode_batch(
                body, content_encoding=content_encoding, max_bytes=self.max_body_bytes
            )
        except IngestError as exc:
            self.count_rejection(exc)
            raise
        return self.apply(batch)

    def apply(self, batch: ReportBatch) -> IngestResult:
        """Apply an already validated batch whole. Raises `OverLimit` (and counts it) for a batch
        past a cardinality limit."""
        with self._lock:
            try:
                return self._state.apply(batch, self._clock.monotonic(), self._clock.time_ns())
            except OverLimit as exc:
                self._state.reject(exc.reason)
                raise

    def count_rejection(self, error: IngestError) -> None:
        """Count a refused request under its reason (also those refused before decoding)."""
        with self._lock:
            self._state.reject(error.reason)

    def snapshot(self) -> CollectorSnapshot:
        """Expire silent ranks, then take an immutable snapshot of everything."""
        with self._lock:
            now = self._clock.monotonic()
            self._state.expire(now)
            return build_snapshot(self._state, now)

    def families(self) -> tuple[MetricFamily, ...]:
        """The exported metric families for the current state."""
        return metric_families(self.snapshot())
