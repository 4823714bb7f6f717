"""Ingest: decode and validate a batch, then apply it whole to the aggregation state.

`decode_batch` turns a request body into a validated `ReportBatch` or raises a typed
`IngestError` naming the field (gzip is inflated with a hard output limit, so a small compressed
body cannot expand past the limit). `Aggregator` is the thread-safe facade the HTTP layer and the
exporters share: one lock around the state, an injected clock, and rejection counts by reason.
A batch is validated completely before the state is touched, so a bad batch changes nothing.
"""

from __future__ import annotations

import json
import threading
import zlib

from mfuscope.collector._snapshot_builder import build_snapshot
from mfuscope.collector._state import AggregationState, IngestResult, StateConfig
from mfuscope.collector.clock import Clock, SystemClock
from mfuscope.collector.errors import (
    BadRequest,
    IngestError,
    OverLimit,
    PayloadTooLarge,
    UnsupportedVersion,
)
from mfuscope.collector.series import metric_families
from mfuscope.collector.snapshot import CollectorSnapshot
from mfuscope.core.errors import SchemaError
from mfuscope.core.schema import ReportBatch, parse_batch
from mfuscope.exporters.model import MetricFamily

__all__ = ["DEFAULT_MAX_BODY_BYTES", "Aggregator", "IngestResult", "decode_batch"]

DEFAULT_MAX_BODY_BYTES = 16 << 20
# Schema fields whose bad values mean "a report this collector does not speak", not "a broken one".
_VERSION_FIELDS = frozenset({"schema", "version"})


def _inflate(body: bytes, max_bytes: int) -> bytes:
    # wbits=31: gzip container only (RFC 1952). Ask for one byte over the limit to detect excess
    # without inflating a bomb.
    inflater = zlib.decompressobj(wbits=31)
    try:
        data = inflater.decompress(body, max_bytes + 1)
    except zlib.error as exc:
        raise BadRequest("body", f"not valid gzip: {exc}") from None
    if len(data) > max_bytes:
        raise PayloadTooLarge("body", f"gzip-decoded body is over {max_bytes} bytes")
    if not inflater.eof:
        raise BadRequest("body", "truncated gzip stream")
    if inflater.unused_data:
        raise BadRequest("body", "data after the end of the gzip member")
    return data


def decode_batch(body: bytes, *, content_encoding: str = "", max_bytes: int) -> ReportBatch:
    """Validate one request body as a batch. `content_encoding` is the request's
    ``Content-Encoding`` (``gzip`` or none). Raises `IngestError`."""
    if len(body) > max_bytes:
        raise PayloadTooLarge("body", f"body is over {max_bytes} bytes")
    encoding = content_encoding.strip().lower()
    if encoding in ("gzip", "x-gzip"):
        body = _inflate(body, max_bytes)
    elif encoding not in ("", "identity"):
        raise BadRequest("content-encoding", f"unsupported content encoding {encoding!r}")
    try:
        raw = json.loads(body)
    except (ValueError, RecursionError) as exc:  # UnicodeDecodeError is a ValueError
        raise BadRequest("body", f"not JSON: {str(exc)[:200]}") from None
    try:
        return parse_batch(raw)
    except SchemaError as exc:
        wrong_version = exc.field in _VERSION_FIELDS and exc.message != "missing"
        kind = UnsupportedVersion if wrong_version else BadRequest
        raise kind(exc.field, exc.message) from None
    except (OverflowError, RecursionError, TypeError, ValueError) as exc:
        # The schema's typed errors cover what it checks; anything else it trips over (e.g. an
        # integer too large for a float) is still the client's bad input, never a server error.
        raise BadRequest("body", f"invalid value: {str(exc)[:200]}") from None


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
