"""Host ranges in which activation recomputation is launched, per thread.

Work launched (GPU) or run (CPU) on a thread inside one of these ranges is recomputation:
- ``mfuscope::recompute``: the annotation the mfuscope agent wraps recomputation in
  (a ``torch.utils.checkpoint`` ``context_fn``);
- reentrant checkpointing: the ``CheckpointFunctionBackward`` operator re-runs the forward and
  then runs the segment's backward *nested in it* (``torch.autograd.backward`` re-enters the
  engine), so its range minus the nested ``autograd::engine::evaluate_function:`` ranges;
- non-reentrant checkpointing, when the trace has Python stack events (``with_stack=True``):
  ``torch/utils/checkpoint.py(N): recompute_fn``, the function that re-runs the forward.
"""

from __future__ import annotations

import bisect
from collections import defaultdict
from itertools import compress, repeat
from operator import attrgetter
from typing import Any

import numpy as np
from mfuscope.core.trace import _read_names
from mfuscope.core.trace._intervals import (
    FloatArray,
    Interval,
    Spans,
    covers,
    subtract,
    union,
)
from mfuscope.core.trace._scan import Event, ScannedEvents, named
from numpy.typing import NDArray

__all__ = [
    "OPERATOR_PREFIXES",
    "PYTHON_SUBSTRINGS",
    "RECOMPUTE_ANNOTATION",
    "RecomputeRanges",
    "recompute_ranges",
]

RECOMPUTE_ANNOTATION = "mfuscope::recompute"
_REENTRANT_OP = _read_names.REENTRANT_OP
_ENGINE_PREFIX = _read_names.ENGINE_PREFIX
_PYTHON_FILE = "torch/utils/checkpoint.py("
_PYTHON_FUNCTION = _read_names.PYTHON_FUNCTION
_NAME = attrgetter("name")
# The operators and Python calls read here (every annotation is).
OPERATOR_PREFIXES = _read_names.RECOMPUTE_OPERATOR_PREFIXES
PYTHON_SUBSTRINGS = _read_names.RECOMPUTE_PYTHON_SUBSTRINGS


class RecomputeRanges:
    """Per-thread sorted disjoint ranges; `contains_each(tid, times)` in O(log n) per time."""

    def __init__(self, by_thread: dict[Any, list[Interval]]) -> None:
        self.by_thread = by_thread
        self._spans = {tid: Spans.from_pairs(ranges) for tid, ranges in by_thread.items()}

    def __bool__(self) -> bool:
        return bool(self.by_thread)

    def contains_each(self, tid: Any, times: FloatArray) -> NDArray[np.bool_]:
        """Whether each of `times` lies in a range of thread `tid`."""
        return covers(self._spans.get(tid, Spans.empty()), times)


def _interval(event: Event) -> Interval:
    start = float(event.ts)
    return (start, start + float(event.dur or 0.0))


def recompute_ranges(scanned: ScannedEvents) -> RecomputeRanges:
    raw: dict[Any, list[Interval]] = defaultdict(list)
    for event in scanned.annotations:
        if event.name == RECOMPUTE_ANNOTATION:
            raw[event.tid].append(_interval(event))
    python = scanned.python  # every Python call when profiled with_stack: select in C
    ends_right = map(str.endswith, map(_NAME, python), repeat(_PYTHON_FUNCTION))
    for event in compress(python, ends_right):
        if _PYTHON_FILE in event.name:
            raw[event.tid].append(_interval(event))

    reentrant: dict[Any, list[Interval]] = defaultdict(list)
    for event in named(scanned.cpu_ops, _REENTRANT_OP):
        reentrant[event.tid].append(_interval(event))
    engine: dict[Any, list[Interval]] = defaultdict(list)
    if reentrant:  # the engine ranges matter only on threads that checkpoint reentrantly
        for event in scanned.cpu_ops:
            if event.tid in reentrant and event.name.startswith(_ENGINE_PREFIX):
                engine[event.tid].append(_interval(event))
    for tid, ranges in reentrant.items():
        nested = sorted(engine.get(tid, []))
        nested_starts = [s for s, _ in nested]
        for start, end in ranges:
            # Engine ranges strictly inside: the segment's own backward, not recomputation.
            lo = bisect.bisect_right(nested_starts, start)
            hi = bisect.bisect_left(nested_starts, end)
            inner = union(iv for iv in nested[lo:hi] if iv[1] <= end)
            raw[tid].extend(subtract([(start, end)], inner))
    return RecomputeRanges({tid: union(ranges) for tid, ranges in raw.items()})
