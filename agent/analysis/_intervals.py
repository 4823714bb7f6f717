"""Interval arithmetic over sorted, disjoint half-open intervals ``[start, end)``.

Every "set of instants" in the decomposition (compute busy, communication active, ...) is a
sorted list of disjoint intervals, so unions, differences and measures are linear merges over
sorted boundaries instead of per-microsecond loops. Inputs are never mutated.
"""

from __future__ import annotations

import bisect
import itertools
import operator
from collections.abc import Iterable, Sequence

__all__ = ["Interval", "IntervalSet", "subtract", "union"]

Interval = tuple[float, float]
_FIRST = operator.itemgetter(0)
_SECOND = operator.itemgetter(1)


def union(intervals: Iterable[Interval]) -> list[Interval]:
    """Sorted disjoint union of arbitrary intervals; empty ones (end <= start) are dropped."""
    ordered = sorted(intervals)
    out: list[Interval] = []
    append = out.append
    cur_start = cur_end = 0.0
    have = False
    for start, end in ordered:
        if end <= start:
            continue
        if have and start <= cur_end:
            if end > cur_end:
                cur_end = end
            continue
        if have:
            append((cur_start, cur_end))
        cur_start, cur_end, have = start, end, True
    if have:
        append((cur_start, cur_end))
    return out


def subtract(a: Sequence[Interval], b: Sequence[Interval]) -> list[Interval]:
    """``a \\ b`` for two sorted disjoint interval lists."""
    out: list[Interval] = []
    j = 0
    nb = len(b)
    for start, end in a:
        while j < nb and b[j][1] <= start:
            j += 1
        k = j
        cur = start
        while k < nb and b[k][0] < end:
            b_start, b_end = b[k]
            if b_start > cur:
                out.append((cur, b_start))
            if b_end > cur:
                cur = b_end
            if cur >= end:
                break
            k += 1
        if cur < end:
            out.append((cur, end))
    return out


class IntervalSet:
    """A sorted disjoint interval list with O(log n) measure of its overlap with any range."""

    __slots__ = ("_cumulative", "_ends", "_starts")

    def __init__(self, disjoint_sorted: Sequence[Interval]) -> None:
        self._starts: list[float] = list(map(_FIRST, disjoint_sorted))
        self._ends: list[float] = list(map(_SECOND, disjoint_sorted))
        # _cumulative[i] is the total length of the first i intervals.
        lengths = map(operator.sub, self._ends, self._starts)
        self._cumulative: list[float] = [0.0, *itertools.accumulate(lengths)]

    def measure(self, lo: float, hi: float) -> float:
        """Length of ``self ∩ [lo, hi)``."""
        if hi <= lo:
            return 0.0
        starts, ends, cumulative = self._starts, self._ends, self._cumulative
        # Intervals i with ends[i] > lo and starts[i] < hi overlap the range.
        first = bisect.bisect_right(ends, lo)
        last = bisect.bisect_left(starts, hi)
        if first >= last:
            return 0.0
        total = cumulative[last] - cumulative[first]
        if starts[first] < lo:
            total -= lo - starts[first]
        if ends[last - 1] > hi:
            total -= ends[last - 1] - hi
        return total

    def __len__(self) -> int:
        return len(self._starts)
