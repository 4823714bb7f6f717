"""`SchemaError`s from msgspec's failures: one line naming the field, as the hand-written parser
gave them."""

from __future__ import annotations

import json
import math
from typing import Any

import msgspec
from mfuscope.core._fields import choice_names
from mfuscope.core.errors import SchemaError

__all__ = ["from_unreadable", "from_validation"]

_AT = " - at `$"
_MAX_MESSAGE = 300


def from_validation(exc: msgspec.ValidationError) -> SchemaError:
    """msgspec's "reason - at `$.a.b[3].c`" as a `SchemaError` on field ``a.b[3].c``."""
    text = str(exc)
    reason, at, where = text.partition(_AT)
    path = where[:-1].lstrip(".") if at else ""
    if reason.startswith("Object missing required field `"):
        name = reason[len("Object missing required field `") : -1]
        return SchemaError(f"{path}.{name}" if path else name, "missing")
    if reason.startswith("Expected `str` matching regex '"):
        names = choice_names(reason[len("Expected `str` matching regex ") :])
        if names is not None:
            reason = f"not one of {', '.join(names)}"
    return SchemaError(path or "batch", reason[:_MAX_MESSAGE])


def from_unreadable(body: bytes | str, reason: str) -> SchemaError:
    """The error for a body msgspec cannot read. Python's parser reads NaN, Infinity and lone
    surrogate escapes, which msgspec rightly refuses: when it reads the body, name the field."""
    try:
        raw = json.loads(body)
    except (ValueError, RecursionError):
        return SchemaError("body", f"not JSON: {reason}"[:_MAX_MESSAGE])
    found = _first_unencodable(raw, "")
    if found is None:
        return SchemaError("body", f"not JSON: {reason}"[:_MAX_MESSAGE])
    return SchemaError(*found)


def _first_unencodable(value: Any, path: str) -> tuple[str, str] | None:
    """The path and fault of the first non-finite number or lone surrogate in `value`."""
    stack = [(value, path)]
    while stack:
        item, where = stack.pop()
        if isinstance(item, float) and not math.isfinite(item):
            return (where or "batch", "must be finite")
        if isinstance(item, str):
            try:
                item.encode("utf-8")
            except UnicodeEncodeError:
                return (where or "batch", "not valid UTF-8 (a lone surrogate)")
        elif isinstance(item, dict):
            for key, child in reversed(item.items()):
                stack.append((key, where))
                stack.append((child, f"{where}.{key}" if where else str(key)))
        elif isinstance(item, list):
            stack.extend((child, f"{where}[{i}]") for i, child in reversed(list(enumerate(item))))
    return None
