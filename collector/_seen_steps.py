"""Which steps of one rank were already counted: the idempotency key ``(job, rank, step)``.

A set of every step ever seen would grow without bound (4,096 ranks x a week of steps), so each
rank keeps a bitmask over the `width` steps at and below its highest step: bit ``k`` set means step
``high - k`` was counted. A step more than `width` below the highest is treated as already counted
(a retry that late is a re-send, not new work). 4,096 steps cost 512 bytes per rank.
"""

from __future__ import annotations

__all__ = ["SeenSteps"]

DEFAULT_WIDTH = 4096


class SeenSteps:
    """Idempotency over the recent steps of one rank (mutable; owned by the aggregation state)."""

    __slots__ = ("_full", "_high", "_mask", "_width")

    def __init__(self, width: int = DEFAULT_WIDTH) -> None:
        if width < 1:
            raise ValueError(f"width must be >= 1, got {width}")
        self._width = width
        self._full = (1 << width) - 1
        self._high = -1
        self._mask = 0

    def is_new(self, step: int) -> bool:
        """True if `step` has not been counted (and is recent enough to count)."""
        if step > self._high:
            return True
        offset = self._high - step
        return offset < self._width and not (self._mask >> offset) & 1

    def add(self, step: int) -> None:
        """Mark `step` counted. Call only after `is_new(step)` returned True."""
        if step > self._high:
            shift = step - self._high
            self._mask = ((self._mask << shift) | 1) & self._full if shift < self._width else 1
            self._high = step
        else:
            self._mask |= 1 << (self._high - step)

    @property
    def high(self) -> int:
        """The highest step counted, -1 before the first (a later incarnation's re-run of a step
        at or below it is redone work)."""
        return self._high
