"""Wire helpers for tests: a batch from a decoded JSON value (dicts, lists, numbers, strings)."""

from __future__ import annotations

import json
from typing import Any

from mfuscope.core.schema import ReportBatch, decode_batch

__all__ = ["decode_value"]


def decode_value(raw: Any) -> ReportBatch:
    """`raw` as a batch, by the one decoder a request body goes through (NaN and infinities
    written as JSON's non-standard tokens, so the decoder sees and refuses them)."""
    return decode_batch(json.dumps(raw, allow_nan=True))
