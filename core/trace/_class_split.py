"""The compute and recompute buckets split by kernel class (docs/analyze.md, "Kernel classes").

Definition: an instant of the bucket belongs to the classes of the kernels of that bucket
running at it, shared equally when kernels of several classes overlap (as exposed
communication is shared by the collectives active at an instant). So the classes of a
window sum to its bucket exactly (to float rounding), and a class is never counted twice.

Cost: nothing when one class is present (it is the whole bucket, already measured); else one
union per class present and one pass over the elementary segments between their boundaries
(vectorised; few classes).
"""

from __future__ import annotations

import numpy as np
from mfuscope.core.trace._intervals import (
    FloatArray,
    IntervalSet,
    Spans,
    covers,
    sorted_unique,
    subtract_spans,
    union_spans,
)
from mfuscope.core.trace.kernel_classes import KERNEL_CLASSES
from numpy.typing import NDArray

__all__ = ["class_time_per_window", "family_time_per_window"]


def class_time_per_window(
    spans: Spans,
    classes: NDArray[np.int8] | None,
    minus: Spans | None,
    window_starts: FloatArray,
    window_ends: FloatArray,
    bucket_per_window: list[float],
) -> list[dict[str, float]]:
    """Per window, class name -> time (the trace's unit) of ``union(spans) \\ minus`` split by
    the class of each span (see the module docstring); `bucket_per_window` is that bucket's
    time per window, already measured. Every class appears, with 0.0 if absent; no classes
    known (None: a CPU timeline): an empty mapping per window."""
    n_windows = len(window_starts)
    if classes is None:
        return [{} for _ in range(n_windows)]
    totals = np.zeros((len(KERNEL_CLASSES), n_windows))
    present = np.flatnonzero(np.bincount(classes, minlength=len(KERNEL_CLASSES))).tolist()
    if len(present) == 1:  # one class: it is the whole bucket
        totals[present[0]] = bucket_per_window
        return _by_name(totals)
    unions: dict[int, Spans] = {}
    for code in present:
        chosen = classes == code
        union = union_spans(Spans(spans.starts[chosen], spans.ends[chosen]))
        if minus is not None and len(minus):
            union = subtract_spans(union, minus)
        if len(union):
            unions[code] = union
    if len(unions) == 1:  # one class left once `minus` is taken out
        ((code, union),) = unions.items()
        totals[code] = IntervalSet(union).measure_each(window_starts, window_ends)
    elif unions:
        points = sorted_unique(
            np.concatenate(
                [window_starts, window_ends, *(u.starts for u in unions.values())]
                + [u.ends for u in unions.values()]
            )
        )
        lo, length = points[:-1], np.diff(points)
        active = {code: covers(u, lo) for code, u in unions.items()}
        count = np.sum(list(active.values()), axis=0)
        window = np.searchsorted(window_starts, lo, side="right") - 1
        inside = (window >= 0) & (count > 0)
        inside &= lo < window_ends[np.maximum(window, 0)]
        share = np.where(inside, length / np.maximum(count, 1), 0.0)
        for code, on in active.items():
            chosen = on & inside
            totals[code] = np.bincount(window[chosen], weights=share[chosen], minlength=n_windows)
    return _by_name(totals)


def _by_name(totals: NDArray[np.float64]) -> list[dict[str, float]]:
    return [
        {name: float(totals[code, w]) for code, name in enumerate(KERNEL_CLASSES)}
        for w in range(totals.shape[1])
    ]


def family_time_per_window(
    spans: Spans,
    families: NDArray[np.int16] | None,
    names: tuple[str, ...],
    window_starts: FloatArray,
    window_ends: FloatArray,
) -> list[tuple[tuple[str, float], ...]]:
    """Per window, ``(family, kernel time)`` of the compute kernels that start in it (the
    trace's unit), each kernel's time cut at the window's end, largest first. Kernel time, not
    a share of the bucket: kernels of one family that overlap each count (it says which kernels
    grew between two runs, `mfuscope compare`). Empty per window without families (CPU)."""
    n_windows = len(window_starts)
    if families is None or not len(families) or not n_windows:
        return [() for _ in range(n_windows)]
    window = np.searchsorted(window_starts, spans.starts, side="right") - 1
    inside = window >= 0
    window = np.maximum(window, 0)
    seconds = np.minimum(spans.ends, window_ends[window]) - spans.starts
    inside &= seconds > 0
    width = len(names)
    totals = np.bincount(
        window[inside] * width + families[inside],
        weights=seconds[inside],
        minlength=n_windows * width,
    ).reshape(n_windows, width)
    out = []
    for row in totals:
        present = np.flatnonzero(row)
        order = present[np.argsort(-row[present], kind="stable")]
        out.append(tuple((names[code], float(row[code])) for code in order.tolist()))
    return out
