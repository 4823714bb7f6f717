"""The field types of the wire schema: what a valid name, count, duration or choice is, said once.

The wire records (`schema`, `collective_records`, `hwcounters`) are msgspec Structs whose fields
carry these constrained types, so one msgspec decoder checks every field of a batch in C while it
decodes (msgspec's ``Meta`` constraints: bounds, lengths, patterns). What no single field can say
(a sum across fields, an order between two of them) is each record module's ``check_*`` function,
run on the decoded records. `schema.decode_batch` turns a failure of either into one `SchemaError`
naming the field.

JSON cannot spell NaN or infinity, and msgspec refuses numbers beyond a double's range, so a
decoded float is always finite; the bounds below keep it physical.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Annotated

from msgspec import Meta

__all__ = [
    "MAX_COUNT",
    "MAX_NAME_LEN",
    "Count",
    "Flag",
    "Label",
    "Name",
    "UnixNanos",
    "choice",
    "choice_names",
    "choice_pattern",
    "count",
    "number",
]

MAX_NAME_LEN = 256  # characters; every string field (job, host, device, axis) is a label value
MAX_COUNT = 1 << 62  # counters, sequence numbers, timestamps: far below int64's end

# A non-empty label value (job, host, device, axis).
Name = Annotated[str, Meta(min_length=1, max_length=MAX_NAME_LEN)]
# A label value that may be empty ("" meaning "not given").
Label = Annotated[str, Meta(max_length=MAX_NAME_LEN)]
Count = Annotated[int, Meta(ge=0, le=MAX_COUNT)]
UnixNanos = Count
Flag = bool

# The names each choice pattern allows, by the pattern as msgspec quotes it in an error (its repr).
_CHOICES: dict[str, tuple[str, ...]] = {}


def choice_pattern(allowed: Iterable[str]) -> str:
    """The pattern matching exactly one of `allowed` (``\\Z``, not ``$``: no trailing newline)."""
    return "^(" + "|".join(re.escape(name) for name in allowed) + r")\Z"


def choice(allowed: Iterable[str]) -> Meta:
    """The constraint of a string field that is one of `allowed` (a vocabulary tuple)."""
    names = tuple(allowed)
    pattern = choice_pattern(names)
    _CHOICES[repr(pattern)] = names
    return Meta(pattern=pattern)


def count(lo: int = 0, hi: int = MAX_COUNT) -> Meta:
    """An integer in ``[lo, hi]``."""
    return Meta(ge=lo, le=hi)


def number(lo: float = 0.0, hi: float | None = None) -> Meta:
    """A float in ``[lo, hi]`` (an integer on the wire is read as a float)."""
    return Meta(ge=lo) if hi is None else Meta(ge=lo, le=hi)


def choice_names(quoted_pattern: str) -> tuple[str, ...] | None:
    """The names a `choice` allows, from its pattern as msgspec's error quotes it (None: some
    other pattern). "not one of a, b" reads better than a regular expression."""
    return _CHOICES.get(quoted_pattern)
