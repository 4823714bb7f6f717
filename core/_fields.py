"""The checks every field of the wire schema goes through: one place for what a valid string,
number, list or object is (a `SchemaError` naming the field otherwise). Used by `schema` and by
the hardware-counter record's parser in `hwcounters`."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from mfuscope.core.errors import SchemaError

__all__ = [
    "MAX_NAME_LEN",
    "choice",
    "entries",
    "flag",
    "integer",
    "number",
    "obj",
    "required",
    "text",
]

MAX_NAME_LEN = 256  # characters; every string field (job, host, device, axis) is a label value


def required(obj: Mapping[str, Any], key: str, path: str) -> Any:
    if key not in obj:
        raise SchemaError(f"{path}{key}", "missing")
    return obj[key]


def text(value: Any, path: str, *, allow_empty: bool = False) -> str:
    if not isinstance(value, str):
        raise SchemaError(path, f"expected a string, got {type(value).__name__}")
    if not allow_empty and not value:
        raise SchemaError(path, "must not be empty")
    if len(value) > MAX_NAME_LEN:
        raise SchemaError(path, f"longer than {MAX_NAME_LEN} characters")
    if not value.isascii():
        try:  # JSON can spell lone surrogates ("\\ud800"): no UTF-8 encoding, so no label value
            value.encode("utf-8")
        except UnicodeEncodeError:
            raise SchemaError(path, "not valid UTF-8 (a lone surrogate)") from None
    return value


def integer(value: Any, path: str, *, lo: int = 0, hi: int = 1 << 62) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise SchemaError(path, f"expected an integer, got {type(value).__name__}")
    if not lo <= value <= hi:
        raise SchemaError(path, f"{value} outside [{lo}, {hi}]")
    return value


def number(value: Any, path: str, *, lo: float = 0.0, hi: float = math.inf) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise SchemaError(path, f"expected a number, got {type(value).__name__}")
    try:
        result = float(value)
    except OverflowError:  # an integer with hundreds of digits
        raise SchemaError(path, "too large to be a number") from None
    if math.isnan(result) or math.isinf(result):
        raise SchemaError(path, "must be finite")
    if not lo <= result <= hi:
        raise SchemaError(path, f"{result} outside [{lo}, {hi}]")
    return result


def flag(value: Any, path: str) -> bool:
    if not isinstance(value, bool):
        raise SchemaError(path, "expected true or false")
    return value


def choice(value: Any, path: str, allowed: tuple[str, ...]) -> str:
    name = text(value, path)
    if name not in allowed:
        raise SchemaError(path, f"{name!r} is not one of {', '.join(allowed)}")
    return name


def entries(value: Any, path: str, max_len: int) -> list[Any]:
    if not isinstance(value, list):
        raise SchemaError(path, f"expected a list, got {type(value).__name__}")
    if len(value) > max_len:
        raise SchemaError(path, f"more than {max_len} entries")
    return value


def obj(value: Any, path: str) -> Mapping[str, Any]:
    if not isinstance(value, dict):
        raise SchemaError(path, f"expected an object, got {type(value).__name__}")
    return value
