"""Ingest: decode and validate a request body as a batch, before anything applies it.

`decode_batch` turns a request body into a validated `ReportBatch` or raises a typed
`IngestError` naming the field (gzip is inflated with a hard output limit, so a small compressed
body cannot expand past the limit). The state it is applied to, whole, is behind
`mfuscope.collector._aggregator.Aggregator`.
"""

from __future__ import annotations

import zlib

from mfuscope.collector._errors import BadRequest, PayloadTooLarge, UnsupportedVersion
from mfuscope.collector._state import IngestResult
from mfuscope.core.errors import SchemaError
from mfuscope.core.schema import ReportBatch
from mfuscope.core.schema import decode_batch as decode_batch_body

__all__ = ["DEFAULT_MAX_BODY_BYTES", "IngestResult", "decode_batch"]

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
        return decode_batch_body(body)
    except SchemaError as exc:
        wrong_version = exc.field in _VERSION_FIELDS and exc.message != "missing"
        kind = UnsupportedVersion if wrong_version else BadRequest
        raise kind(exc.field, exc.message) from None
