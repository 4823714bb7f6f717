"""The decomposition of a normalised `Timeline` into per-step buckets.

Definitions: docs/definitions.md#step-buckets.

Every instant of a step window belongs to the first bucket that applies:
compute > recompute > exposed_comm > other > bubble. With C the union of compute, R of
recompute, M of communication and O of copies/memsets (all sorted disjoint interval lists):

    compute      = |C ∩ W|
    recompute    = |(R \\ C) ∩ W|
    exposed comm = |(M \\ (C ∪ R)) ∩ W|, shared equally by the collectives active at each instant
    other        = |(O \\ (C ∪ R) \\ M) ∩ W|
    bubble       = |W| - the rest   (so the buckets sum to the window exactly)

Beside the buckets, per step and (op, axis, tier) of its collectives, the busy time C ∪ R inside
the span from the first one's start to the last one's end (`CommSpan`): what the steps between
profiled windows weigh their own collective durations against
(docs/definitions.md#carried-gpu-steps).

The per-collective attribution sweeps the collectives' boundaries (few) and measures the busy
set C ∪ R on each elementary segment in O(log n) with prefix sums, so the cost is one sort of
the device events plus linear merges.

Pipeline rule: the exposed share of a ``send``/``recv`` on the ``pp`` axis counts as exposed
communication up to the ideal transfer time ``alpha + bytes / beta`` of its tier (consumed in
time order across windows) and as ``bubble_pipeline`` beyond it. When the ideal time is unknown
(no link model for the tier, or unknown size) the whole exposed share is ``bubble_pipeline``:
a pipeline p2p that is not hidden is, to first order, a stage waiting for its peer, and the
transfer itself is small next to that.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Mapping

import numpy as np
from mfuscope.core.bandwidth import (
    LinkModel,
    algbw_bytes_per_s,
    busbw_bytes_per_s,
    ideal_transfer_s,
)
from mfuscope.core.mfu import hfu_or_none, mfu_or_none
from mfuscope.core.trace._class_split import class_time_per_window, family_time_per_window
from mfuscope.core.trace._collectives import BOOKKEEPING
from mfuscope.core.trace._intervals import IntervalSet, Spans, subtract_spans, union_spans
from mfuscope.core.trace._trace_model import CommActivity, StepWindow, Timeline
from mfuscope.core.trace.kernel_classes import FAMILY_NAMES
from mfuscope.core.trace.result import (
    AnalysisOptions,
    CollectiveRecord,
    CommSpan,
    ExposedComm,
    KernelClassSeconds,
    StepDecomposition,
)
from mfuscope.core.vocabulary import COLLECTIVE_OPS, P2P_OPS, PIPELINE_AXIS

__all__ = ["decompose_timeline"]

_US = 1e-6  # trace microseconds -> seconds


def _comm_sweep(
    comms: tuple[CommActivity, ...], busy: IntervalSet, windows: tuple[StepWindow, ...]
) -> tuple[list[float], list[dict[int, float]]]:
    """Per collective: time under compute (µs), and its exposed share per window index (µs)."""
    overlapped = [0.0] * len(comms)
    exposed: list[dict[int, float]] = [{} for _ in comms]
    starting: dict[float, list[int]] = defaultdict(list)
    ending: dict[float, list[int]] = defaultdict(list)
    for i, comm in enumerate(comms):
        if comm.end > comm.start:
            starting[comm.start].append(i)
            ending[comm.end].append(i)
    points = sorted({*starting, *ending, *(w.start for w in windows), *(w.end for w in windows)})
    boundaries = np.array(points, dtype=np.float64)
    under_each = busy.measure_each(boundaries[:-1], boundaries[1:]).tolist()
    active: list[int] = []
    w = 0
    n_windows = len(windows)
    for k in range(len(points) - 1):
        t = points[k]
        if t in ending:
            gone = set(ending[t])
            active = [i for i in active if i not in gone]
        if t in starting:
            active.extend(starting[t])
        if not active:
            continue
        a, b = t, points[k + 1]
        under = under_each[k]
        for i in active:
            overlapped[i] += under
        hidden_free = (b - a) - under
        if hidden_free <= 0:
            continue
        while w < n_windows and windows[w].end <= a:
            w += 1
        if w < n_windows and windows[w].start <= a:
            share = hidden_free / len(active)
            for i in active:
                exposed[i][w] = exposed[i].get(w, 0.0) + share
    return overlapped, exposed


def _comm_spans(
    reach: dict[tuple[int, str, str, str], list[float]],
    windows: tuple[StepWindow, ...],
    busy: IntervalSet,
) -> list[tuple[CommSpan, ...]]:
    """Per window, the busy time inside each (op, axis, tier)'s span of collectives, the span
    clipped to the window (`CommSpan`)."""
    keys = sorted(reach)
    lo = np.array([reach[key][0] for key in keys], dtype=np.float64)
    hi = np.array([min(reach[key][1], windows[key[0]].end) for key in keys], dtype=np.float64)
    busy_us = busy.measure_each(lo, hi).tolist()
    out: list[list[CommSpan]] = [[] for _ in windows]
    for (w, op, axis, tier), us in zip(keys, busy_us, strict=True):
        out[w].append(CommSpan(op, axis, tier, us * _US))
    return [tuple(spans) for spans in out]


def _ideal_us(comm: CommActivity, links: Mapping[str, LinkModel] | None) -> float | None:
    if links is None or comm.bytes is None or comm.tier not in links:
        return None
    return ideal_transfer_s(links[comm.tier], comm.bytes) / _US


def _record(comm: CommActivity, overlapped_us: float) -> CollectiveRecord:
    duration_us = comm.duration
    seconds = max(duration_us, 0.0) * _US
    algbw = busbw = None
    assert comm.op is not None
    if comm.bytes is not None and seconds > 0:
        algbw = algbw_bytes_per_s(comm.bytes, seconds)
        if comm.group_size is not None:
            busbw = busbw_bytes_per_s(comm.op, comm.group_size, comm.bytes, seconds)
    in_flight_us = duration_us + comm.queued
    ratio = min(1.0, overlapped_us / in_flight_us) if in_flight_us > 0 else 0.0
    return CollectiveRecord(
        op=comm.op,
        axis=comm.axis,
        tier=comm.tier,
        # Unknown group: null with the reason, never the world size (a guess that would make
        # busbw wrong); busbw stays None.
        group_size=comm.group_size,
        group_size_reason=comm.group_unknown_reason if comm.group_size is None else None,
        bytes=comm.bytes,
        seconds=seconds,
        algbw_bytes_per_s=algbw,
        busbw_bytes_per_s=busbw,
        overlapped_ratio=ratio,
    )


def _flops_ratios(
    wall_s: float, recompute_s: float, options: AnalysisOptions
) -> tuple[float | None, float | None]:
    model, peak = options.model_flops_per_step, options.peak_flops
    if model is None:
        return None, None
    recompute_flops = options.recompute_flops_per_step
    if recompute_flops is None and recompute_s <= 0:
        recompute_flops = 0.0  # no recomputation in the step; unknown FLOPs of one there: no HFU
    return mfu_or_none(model, peak, wall_s), hfu_or_none(model, recompute_flops, peak, wall_s)


def _seconds(by_class_us: dict[str, float]) -> KernelClassSeconds | None:
    if not by_class_us:
        return None
    return KernelClassSeconds(**{name: us * _US for name, us in by_class_us.items()})


def decompose_timeline(
    timeline: Timeline, options: AnalysisOptions
) -> tuple[StepDecomposition, ...]:
    """Split every step window of `timeline` into the step buckets (seconds)."""
    windows = timeline.windows
    compute = union_spans(timeline.compute)
    recompute = subtract_spans(union_spans(timeline.recompute), compute)
    # Both are sorted and disjoint, so without recompute their union is `compute` itself.
    busy_spans = compute
    if len(recompute):
        busy_spans = union_spans(
            Spans(
                np.concatenate((compute.starts, recompute.starts)),
                np.concatenate((compute.ends, recompute.ends)),
            )
        )
    comms = tuple(sorted(timeline.comms, key=CommActivity.sort_key))
    comm_union = union_spans(
        Spans(
            np.array([c.start for c in comms], dtype=np.float64),
            np.array([c.end for c in comms], dtype=np.float64),
        )
    )
    exposed_union = subtract_spans(comm_union, busy_spans)
    other = subtract_spans(subtract_spans(union_spans(timeline.other), busy_spans), comm_union)

    compute_set, recompute_set = IntervalSet(compute), IntervalSet(recompute)
    busy, other_set = IntervalSet(busy_spans), IntervalSet(other)
    comm_set, exposed_set = IntervalSet(comm_union), IntervalSet(exposed_union)
    overlapped, exposed = _comm_sweep(comms, busy, windows)

    # Exposed shares per window: (axis, tier) -> comm µs, and the pipeline-bubble µs.
    comm_parts: list[dict[tuple[str, str], float]] = [defaultdict(float) for _ in windows]
    pipeline = [0.0] * len(windows)
    for i, comm in enumerate(comms):
        shares = exposed[i]
        if not shares:
            continue
        is_pipeline = comm.op in P2P_OPS and comm.axis == PIPELINE_AXIS
        ideal_left = _ideal_us(comm, options.links) if is_pipeline else None
        for w in sorted(shares):
            share = shares[w]
            if not is_pipeline:
                comm_parts[w][(comm.axis, comm.tier)] += share
                continue
            as_comm = 0.0 if ideal_left is None else min(share, ideal_left)
            if ideal_left is not None:
                ideal_left -= as_comm
            if as_comm > 0:
                comm_parts[w][(comm.axis, comm.tier)] += as_comm
            pipeline[w] += share - as_comm

    records: list[list[CollectiveRecord]] = [[] for _ in windows]
    # (window, op, axis, tier) -> [first start, last end] of its collectives (µs)
    reach: dict[tuple[int, str, str, str], list[float]] = {}
    starts = [w.start for w in windows]
    w = 0
    for i, comm in enumerate(comms):  # sorted by start
        if comm.op is None or comm.op == BOOKKEEPING or comm.op not in COLLECTIVE_OPS:
            continue
        while w < len(windows) and windows[w].end <= comm.start:
            w += 1
        if w < len(windows) and starts[w] <= comm.start:
            records[w].append(_record(comm, overlapped[i]))
            span = reach.setdefault((w, comm.op, comm.axis, comm.tier), [comm.start, comm.end])
            span[1] = max(span[1], comm.end)
    spans = _comm_spans(reach, windows, busy)

    window_starts = np.array(starts, dtype=np.float64)
    window_ends = np.array([w.end for w in windows], dtype=np.float64)

    def per_window(spans: IntervalSet) -> list[float]:
        measures: list[float] = spans.measure_each(window_starts, window_ends).tolist()
        return measures

    compute_us, recompute_us, other_us = map(per_window, (compute_set, recompute_set, other_set))
    compute_classes = class_time_per_window(
        timeline.compute, timeline.compute_class, None, window_starts, window_ends, compute_us
    )
    recompute_classes = class_time_per_window(
        timeline.recompute,
        timeline.recompute_class,
        compute,
        window_starts,
        window_ends,
        recompute_us,
    )
    families = family_time_per_window(
        timeline.compute, timeline.compute_family, FAMILY_NAMES, window_starts, window_ends
    )
    comm_us, exposed_us = per_window(comm_set), per_window(exposed_set)
    steps: list[StepDecomposition] = []
    for k, window in enumerate(windows):
        lo, hi = window.start, window.end
        wall_s = (hi - lo) * _US
        compute_s = compute_us[k] * _US
        recompute_s = recompute_us[k] * _US
        other_s = other_us[k] * _US
        overlapped_s = max(0.0, comm_us[k] - exposed_us[k]) * _US
        entries = tuple(
            ExposedComm(axis=axis, tier=tier, seconds=us * _US)
            for (axis, tier), us in sorted(comm_parts[k].items())
            if us > 0
        )
        exposed_s = math.fsum(e.seconds for e in entries)
        pipeline_s = pipeline[k] * _US
        idle_s = max(0.0, wall_s - math.fsum((compute_s, recompute_s, exposed_s, other_s)))
        idle_s = max(0.0, idle_s - pipeline_s)
        mfu, hfu = _flops_ratios(wall_s, recompute_s, options)
        steps.append(
            StepDecomposition(
                step=window.step,
                start_s=lo * _US + timeline.clock_offset_s,
                wall_s=wall_s,
                compute_s=compute_s,
                recompute_s=recompute_s,
                exposed_comm_s=exposed_s,
                other_s=other_s,
                bubble_s=pipeline_s + idle_s,
                bubble_pipeline_s=pipeline_s,
                bubble_idle_s=idle_s,
                overlapped_comm_s=overlapped_s,
                exposed_comm=entries,
                collectives=tuple(records[k]),
                mfu=mfu,
                hfu=hfu,
                window_source=window.source,
                compute_classes=_seconds(compute_classes[k]),
                recompute_classes=_seconds(recompute_classes[k]),
                compute_families=tuple((f, us * _US) for f, us in families[k]),
                comm_spans=spans[k],
            )
        )
    return tuple(steps)
