"""CPU-only traces (gloo backend): host threads -> the normalised `Timeline`.

What torch 2.x writes for a gloo job (verified on torch 2.13 traces of real gloo jobs):
- no ``record_param_comms`` and no kernels; each collective is a ``user_annotation``
  ``gloo:<op>`` on a ``pt_gloo_runloop`` worker thread, lasting from when the worker picks the
  work up until it completes (waiting for peers included); ``Input Dims`` / ``Input type`` give
  the *input* tensors; send/recv run blocking on the calling thread;
- the ``c10d::*`` operators on the training threads only enqueue work: they are cut out of the
  compute time of their thread. A collective is *in flight* from its enqueue until its work item
  completes on the worker (docs/definitions.md#blocked-waits-on-cpu): gloo's worker may pick the
  item up milliseconds after the enqueue under load (figures:
  benchmarks/RESULTS.md#profiled-steps-and-cpu-timelines), and a caller blocked in the collective
  meanwhile shows nothing on the trace. So a collective's communication interval starts at its
  enqueue; its `CommActivity.duration` (bandwidth) stays the worker's own span. Enqueues and work
  items are paired in order per op (gloo's work queue is first in, first out; gloo runs
  ``reduce_scatter`` as ``all_reduce``);
- process groups appear only in ``distributedInfo.pg_config``: an annotation does not say which
  group it belongs to. Each group has worker threads of its own, so the thread -> group map that
  the live agent discovers (`AnalysisOptions.gloo_worker_groups`, or the trace's own
  ``mfuscope.gloo_worker_groups``, `worker_groups`) names the group of every annotation on a
  mapped thread; without it the group is known only when the trace has a single multi-rank group
  (send/recv, on the calling thread: see `_gloo_p2p`).

Compute is the time any training thread (every thread that is not a gloo worker) runs an
operator. Step N's window runs from the start of ``ProfilerStep#N`` to the start of the next
one (the last step ends with its own range): on CPU the first operator launched inside a step
starts with it. Without steps, windows are chosen as `_windows` says.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Mapping
from typing import Any

from mfuscope.core.trace._collectives import (
    BOOKKEEPING,
    AttributedGroup,
    GroupInfo,
    ProcessGroups,
    TopologyView,
    dtype_size,
    normalise_op,
)
from mfuscope.core.trace._events import EventArgs, KinetoTrace
from mfuscope.core.trace._gloo_p2p import pipeline_p2p_group
from mfuscope.core.trace._intervals import Interval, Spans, subtract, union
from mfuscope.core.trace._recompute import recompute_ranges
from mfuscope.core.trace._scan import Event, ScannedEvents
from mfuscope.core.trace._steps import CpuStep
from mfuscope.core.trace._trace_model import CommActivity, RankContext, StepWindow, Timeline
from mfuscope.core.trace._windows import choose_windows
from mfuscope.core.vocabulary import AXIS_UNKNOWN, P2P_OPS, TIER_UNKNOWN

__all__ = ["cpu_timeline"]

_GLOO_PREFIX = "gloo:"
_ENQUEUE_PREFIX = "c10d::"


def _gloo_threads(scanned: ScannedEvents, step_threads: set[Any]) -> set[Any]:
    threads: set[Any] = set()
    for event in scanned.meta:
        if event.name == "thread_name" and event.args is not None:
            label = event.args.name
            if isinstance(label, str) and "gloo" in label:
                threads.add(event.tid)
    for event in scanned.annotations:
        name = event.name
        if name.startswith(_GLOO_PREFIX):
            op = normalise_op(name)
            if op not in P2P_OPS and event.tid not in step_threads:
                threads.add(event.tid)
    return threads


def _input_elements(args: EventArgs | None) -> tuple[int, int] | None:
    """(elements, bytes per element) summed over the input tensors; None if not recorded."""
    if args is None:
        return None
    dims, types = args.input_dims, args.input_type
    if not isinstance(dims, list) or not isinstance(types, list) or len(dims) != len(types):
        return None
    elements = 0
    element_size: int | None = None
    for shape, type_name in zip(dims, types, strict=True):
        if not isinstance(shape, list) or not all(isinstance(d, int) for d in shape):
            continue
        size = dtype_size(type_name)
        if size is None:
            return None
        if element_size is not None and element_size != size:
            return None
        element_size = size
        elements += math.prod(shape)
    return None if element_size is None else (elements, element_size)


def _unmapped_group(groups: ProcessGroups, view: TopologyView) -> AttributedGroup:
    """The group of a gloo annotation on a thread no map names: exact with one multi-rank
    group, else partly known."""
    candidates = groups.multi_rank_groups()
    if len(candidates) == 1:
        return AttributedGroup.of(candidates[0], view, "the trace's only process group")
    if not candidates:  # no pg_config: the axis and tier of the world, but no group size
        world = GroupInfo(name="", desc="default_pg", ranks=None, size=view.world_size)
        return AttributedGroup(
            axis=view.axis(world),
            tier=view.tier(tuple(range(view.world_size)), view.world_size),
            size=None,
            unknown_reason="the trace has no process-group table (distributedInfo.pg_config)",
        )
    sizes = {g.size for g in candidates}
    tiers = {view.tier(g.ranks, g.size) for g in candidates}
    size = sizes.pop() if len(sizes) == 1 else None
    return AttributedGroup(
        axis=AXIS_UNKNOWN,
        tier=tiers.pop() if len(tiers) == 1 else TIER_UNKNOWN,
        size=size,
        unknown_reason=None
        if size is not None
        else "the trace has process groups of several sizes and a gloo annotation does not say "
        "which one it ran on",
    )


def _groups_by_thread(
    worker_groups: Mapping[int, str] | None, groups: ProcessGroups, view: TopologyView
) -> dict[Any, AttributedGroup]:
    """Worker thread id -> its group, for the threads whose group the trace's table lists."""
    by_thread: dict[Any, AttributedGroup] = {}
    for tid, name in (worker_groups or {}).items():
        group = groups.by_name.get(name)
        if group is None:
            continue
        by_thread[tid] = AttributedGroup.of(group, view, f"process group {name!r}")
    return by_thread


def _comm_activity(
    event: Event, group: AttributedGroup, enqueued: float | None = None
) -> CommActivity:
    """`event`'s communication; in flight from `enqueued` (its c10d enqueue) when given."""
    start = float(event.ts)
    duration = float(event.dur or 0.0)
    op = normalise_op(event.name)
    counted = _input_elements(event.args)
    size: int | None = None
    if counted is not None and op != BOOKKEEPING:
        elements, element_size = counted
        size = elements * element_size
        if op == "all_gather":  # the annotation records one rank's input; S is the gathered array
            size = size * group.size if group.size is not None else None
    queued = 0.0 if enqueued is None else max(0.0, start - enqueued)
    return CommActivity(
        start=start - queued,
        end=start + duration,
        duration=duration,
        op=op,
        axis=group.axis,
        tier=group.tier,
        group_size=group.size,
        bytes=size,
        group_unknown_reason=group.unknown_reason,
        queued=queued,
    )


def _match_key(op: str | None) -> str | None:
    # gloo implements reduce_scatter as all_reduce: its work item is a ``gloo:all_reduce``.
    return "all_reduce" if op == "reduce_scatter" else op


class _Enqueues:
    """The c10d enqueues of collectives on the training threads, handed out first in, first
    out per op to the work items that start after them."""

    def __init__(self, events: list[Event]) -> None:
        self._queues: dict[str | None, list[float]] = defaultdict(list)
        self._next: dict[str | None, int] = defaultdict(int)
        for event in sorted(events, key=lambda e: e.ts):
            op = normalise_op(event.name[len(_ENQUEUE_PREFIX) :])
            if op is not None and op not in P2P_OPS:
                self._queues[_match_key(op)].append(float(event.ts))

    def take(self, op: str | None, start: float) -> float | None:
        """The enqueue time of the work item of `op` that the worker starts at `start`."""
        key = _match_key(op)
        queue, i = self._queues.get(key), self._next[key]
        if queue is None or i >= len(queue) or queue[i] > start:
            return None
        self._next[key] = i + 1
        return queue[i]


def _host_windows(steps: list[CpuStep]) -> tuple[StepWindow, ...]:
    """On CPU the first operator launched inside a range starts with it: a window runs from
    its range's start to the next range's start (the last one to its own end)."""
    windows = (
        StepWindow(step.step, step.start, steps[i + 1].start if i + 1 < len(steps) else step.end)
        for i, step in enumerate(steps)
    )
    return tuple(w for w in windows if w.end > w.start)


def cpu_timeline(trace: KinetoTrace, scanned: ScannedEvents, context: RankContext) -> Timeline:
    step_threads = {e.tid for e in scanned.annotations if e.name.startswith("ProfilerStep#")}
    workers = _gloo_threads(scanned, step_threads)
    group = _unmapped_group(context.groups, context.view)
    p2p_group = pipeline_p2p_group(context.groups, context.view) or group
    by_thread = _groups_by_thread(context.gloo_worker_groups, context.groups, context.view)

    comms: list[CommActivity] = []
    ops: dict[Any, list[Interval]] = defaultdict(list)
    holes: dict[Any, list[Interval]] = defaultdict(list)
    enqueues = _Enqueues(
        [e for e in scanned.cpu_ops if e.tid not in workers and e.name.startswith(_ENQUEUE_PREFIX)]
    )
    work_items = sorted(
        (e for e in scanned.annotations if e.name.startswith(_GLOO_PREFIX)), key=lambda e: e.ts
    )
    for event in work_items:
        name = event.name
        if name.startswith(_GLOO_PREFIX):
            if normalise_op(name) in P2P_OPS:
                # An isend/irecv's annotation lasts until its wait(): the thread computes in
                # between, so the operators inside it stay compute (no hole).
                comms.append(_comm_activity(event, p2p_group))
                continue
            enqueued = enqueues.take(normalise_op(name), float(event.ts))
            comms.append(_comm_activity(event, by_thread.get(event.tid, group), enqueued))
            start = float(event.ts)
            holes[event.tid].append((start, start + float(event.dur or 0.0)))
    for event in scanned.cpu_ops:
        tid = event.tid
        if tid in workers:
            continue
        start = event.ts
        interval = (start, start + event.dur)
        name = event.name
        if name.startswith(_ENQUEUE_PREFIX) or name == "record_param_comms":
            holes[tid].append(interval)
        else:
            ops[tid].append(interval)

    recompute = recompute_ranges(scanned)
    compute: list[Interval] = []
    recomputed: list[Interval] = []
    for tid, intervals in ops.items():
        busy = subtract(union(intervals), union(holes.get(tid, ())))
        ranges = recompute.by_thread.get(tid)
        if ranges:
            not_recompute = subtract(busy, ranges)
            compute.extend(not_recompute)
            recomputed.extend(subtract(busy, not_recompute))
        else:
            compute.extend(busy)
    activity = [*compute, *recomputed, *((c.start, c.end) for c in comms)]
    span = (min(a for a, _ in activity), max(b for _, b in activity)) if activity else None
    windows = choose_windows(scanned, context.windows, _host_windows, span)
    return Timeline(
        rank=context.rank,
        world_size=context.world_size,
        device="cpu",
        clock_offset_s=context.clock_offset_s,
        windows=windows,
        compute=Spans.from_pairs(compute),
        recompute=Spans.from_pairs(recomputed),
        other=Spans.empty(),
        comms=tuple(comms),
    )
