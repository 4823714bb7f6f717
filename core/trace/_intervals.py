"""Interval arithmetic over half-open intervals ``[start, end)`` held as two float arrays.

Every "set of instants" in the decomposition (compute busy, communication active, ...) is a
`Spans`: the starts and the ends of its intervals, as numpy arrays. Unions, differences and
measures are sorts, prefix sums and binary searches over whole arrays, so a trace of a million
kernels costs a few array passes in C instead of a Python loop per kernel (figures:
benchmarks/RESULTS.md#reading). Inputs are never mutated.

The list forms `union` / `subtract` (lists of ``(start, end)`` tuples) serve the callers that
build a handful of intervals per thread; they run the same array code.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import msgspec
import numpy as np
from numpy.typing import NDArray

__all__ = [
    "FloatArray",
    "Interval",
    "IntervalSet",
    "Spans",
    "covers",
    "sorted_unique",
    "subtract",
    "subtract_spans",
    "union",
    "union_spans",
]

Interval = tuple[float, float]
FloatArray = NDArray[np.float64]


class Spans(msgspec.Struct, frozen=True):
    """Intervals ``[starts[i], ends[i])``; sorted and disjoint only where a function says so."""

    starts: FloatArray
    ends: FloatArray

    @classmethod
    def empty(cls) -> Spans:
        return cls(np.empty(0), np.empty(0))

    @classmethod
    def from_pairs(cls, intervals: Iterable[Interval]) -> Spans:
        pairs = np.array(list(intervals), dtype=np.float64).reshape(-1, 2)
        return cls(pairs[:, 0].copy(), pairs[:, 1].copy())

    def pairs(self) -> list[Interval]:
        return list(zip(self.starts.tolist(), self.ends.tolist(), strict=True))

    def __len__(self) -> int:
        return len(self.starts)


def union_spans(spans: Spans) -> Spans:
    """Sorted disjoint union of arbitrary intervals; empty ones (end <= start) are dropped.

    Intervals that touch merge: ``[0, 1) ∪ [1, 2)`` is ``[0, 2)``.
    """
    keep = spans.ends > spans.starts
    starts, ends = spans.starts[keep], spans.ends[keep]
    if len(starts) == 0:
        return Spans.empty()
    order = np.lexsort((ends, starts))
    starts, ends = starts[order], ends[order]
    reach = np.maximum.accumulate(ends)  # the furthest end seen so far
    opens = np.empty(len(starts), dtype=bool)
    opens[0] = True
    np.greater(starts[1:], reach[:-1], out=opens[1:])  # a gap before it: a new interval
    first = np.flatnonzero(opens)
    last = np.append(first[1:] - 1, len(starts) - 1)
    return Spans(starts[first], reach[last])


def covers(spans: Spans, points: FloatArray) -> NDArray[np.bool_]:
    """Whether each point lies in the sorted disjoint `spans`."""
    if len(spans) == 0:
        return np.zeros(len(points), dtype=bool)
    index = np.searchsorted(spans.starts, points, side="right") - 1
    inside: NDArray[np.bool_] = (index >= 0) & (points < spans.ends[np.maximum(index, 0)])
    return inside


def sorted_unique(values: FloatArray) -> FloatArray:
    """The distinct values, sorted: what ``np.unique`` returns, without the masked-array
    module it imports on first use (~15 ms of `mfuscope analyze`'s start-up)."""
    ordered = np.sort(values)
    first = np.empty(len(ordered), dtype=bool)
    first[:1] = True
    np.not_equal(ordered[1:], ordered[:-1], out=first[1:])
    unique: FloatArray = ordered[first]
    return unique


def subtract_spans(a: Spans, b: Spans) -> Spans:
    """``a \\ b`` for two sorted disjoint `Spans`; pieces that touch are merged."""
    if len(a) == 0 or len(b) == 0:
        return a
    # Between two consecutive boundaries of either set, membership in a and in b is constant.
    points = sorted_unique(np.concatenate((a.starts, a.ends, b.starts, b.ends)))
    lo, hi = points[:-1], points[1:]
    keep = covers(a, lo) & ~covers(b, lo)
    lo, hi = lo[keep], hi[keep]
    if len(lo) == 0:
        return Spans.empty()
    opens = np.empty(len(lo), dtype=bool)
    opens[0] = True
    np.not_equal(lo[1:], hi[:-1], out=opens[1:])
    first = np.flatnonzero(opens)
    last = np.append(first[1:] - 1, len(lo) - 1)
    return Spans(lo[first], hi[last])


def union(intervals: Iterable[Interval]) -> list[Interval]:
    """`union_spans` on a list of ``(start, end)`` tuples."""
    return union_spans(Spans.from_pairs(intervals)).pairs()


def subtract(a: Sequence[Interval], b: Sequence[Interval]) -> list[Interval]:
    """`subtract_spans` on two sorted disjoint lists of ``(start, end)`` tuples."""
    return subtract_spans(Spans.from_pairs(a), Spans.from_pairs(b)).pairs()


class IntervalSet:
    """Sorted disjoint `Spans` with O(log n) measure of their overlap with any range."""

    __slots__ = ("_cumulative", "_ends", "_starts")

    def __init__(self, disjoint_sorted: Spans) -> None:
        self._starts = disjoint_sorted.starts
        self._ends = disjoint_sorted.ends
        # _cumulative[i] is the total length of the first i intervals (summed in order).
        self._cumulative = np.concatenate(([0.0], np.cumsum(self._ends - self._starts)))

    def measure_each(self, lo: FloatArray, hi: FloatArray) -> FloatArray:
        """Length of ``self ∩ [lo[k], hi[k])`` for every k."""
        out = np.zeros(len(lo))
        if len(self._starts) == 0 or len(lo) == 0:
            return out
        starts, ends, cumulative = self._starts, self._ends, self._cumulative
        # Intervals i with ends[i] > lo and starts[i] < hi overlap the range.
        first = np.searchsorted(ends, lo, side="right")
        last = np.searchsorted(starts, hi, side="left")
        some = (first < last) & (hi > lo)
        first, last, lo_, hi_ = first[some], last[some], lo[some], hi[some]
        total = cumulative[last] - cumulative[first]
        head_start = starts[first]
        total -= np.where(head_start < lo_, lo_ - head_start, 0.0)
        tail_end = ends[last - 1]
        total -= np.where(tail_end > hi_, tail_end - hi_, 0.0)
        out[some] = total
        return out

    def __len__(self) -> int:
        return len(self._starts)
