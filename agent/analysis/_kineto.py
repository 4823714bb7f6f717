"""GPU traces (NCCL / RCCL): device events -> the normalised `Timeline`.

The device timeline is every kernel, memcpy and memset on the rank's device (all streams).
A device event is linked to the host call that launched it by its ``correlation`` id (the
flow events ``ac2g`` / ``async_cpu_to_gpu`` are absent from some traces; the id never is).

Step windows (issue 2): step N's window starts when the first device event *launched inside*
the CPU ``ProfilerStep#N`` range starts on the device, and ends when step N+1's window starts;
the last step ends when the last device event launched inside it ends. Steps that launched
nothing are skipped.
"""

from __future__ import annotations

import bisect
import operator
from collections import Counter
from collections.abc import Mapping
from typing import Any

import msgspec
from mfuscope.agent.analysis._collectives import (
    GroupInfo,
    ProcessGroups,
    TopologyView,
    dtype_size,
    group_from_args,
    normalise_op,
    op_from_kernel_name,
)
from mfuscope.agent.analysis._events import EventArgs, KinetoTrace
from mfuscope.agent.analysis._intervals import Interval
from mfuscope.agent.analysis._recompute import recompute_ranges
from mfuscope.agent.analysis._scan import Event, ScannedEvents, named
from mfuscope.agent.analysis._steps import profiler_steps
from mfuscope.agent.analysis._trace_model import CommActivity, StepWindow, Timeline
from mfuscope.agent.analysis.result import AXIS_UNKNOWN, TIER_UNKNOWN

__all__ = ["gpu_timeline", "is_comm_kernel"]

DEFAULT_GPUS_PER_NODE = 8
_RECORD_PARAM_COMMS = "record_param_comms"
_PID = operator.attrgetter("pid")
_CORRELATION = operator.attrgetter("args.correlation")
_comm_name_cache: dict[str, bool] = {}
_NO_ARGS = EventArgs()
_encode = msgspec.json.Encoder().encode


def is_comm_kernel(name: str) -> bool:
    """NCCL (``ncclKernel_*``, ``ncclDevKernel_*``) and RCCL kernels are communication."""
    known = _comm_name_cache.get(name)
    if known is None:
        lowered = name.lower()
        known = "nccl" in lowered or "rccl" in lowered
        _comm_name_cache[name] = known
    return known


def _device_pid(scanned: ScannedEvents) -> Any:
    """The device with the most kernels (memcpys if none): the rank's own device."""
    counts = Counter(map(_PID, scanned.kernels or scanned.memops))
    return counts.most_common(1)[0][0]


def _device_name(trace: KinetoTrace, pid: Any) -> str:
    for prop in trace.device_properties or ():
        if isinstance(prop, dict) and prop.get("id") == pid and isinstance(prop.get("name"), str):
            return str(prop["name"])
    return f"gpu {pid}"


class _CommResolver:
    """Collective metadata of an NCCL kernel: its own args, else its ``record_param_comms``."""

    def __init__(self, scanned: ScannedEvents, view: TopologyView, groups: ProcessGroups) -> None:
        self.view = view
        self.groups = groups
        # (group as the args name it) -> (group, axis, tier): a trace has a handful of groups
        # but thousands of collectives.
        self._group_cache: dict[bytes, tuple[GroupInfo, str, str]] = {}
        self.by_external_id: dict[Any, Event] = {}
        by_thread: dict[Any, list[Event]] = {}
        for event in named(scanned.cpu_ops, _RECORD_PARAM_COMMS):
            external_id = None if event.args is None else event.args.external_id
            self.by_external_id[external_id] = event
            by_thread.setdefault(event.tid, []).append(event)
        self.by_thread = {
            tid: sorted(events, key=lambda e: float(e.ts)) for tid, events in by_thread.items()
        }
        self.starts = {tid: [float(e.ts) for e in evs] for tid, evs in self.by_thread.items()}

    def _enclosing(self, launch: Event) -> Event | None:
        tid = launch.tid
        starts = self.starts.get(tid)
        if not starts:
            return None
        t = float(launch.ts)
        i = bisect.bisect_right(starts, t) - 1
        while i >= 0:
            candidate = self.by_thread[tid][i]
            if t <= float(candidate.ts) + float(candidate.dur or 0.0):
                return candidate
            i -= 1
            if i >= 0 and t - starts[i] > 10_000_000.0:  # nothing spans 10 s: stop looking
                break
        return None

    def metadata(self, kernel: Event, launch: Event | None) -> EventArgs | None:
        args = kernel.args
        if args is not None and args.collective_name is not None:
            return args
        if launch is None:
            return None
        rpc = self.by_external_id.get(None if launch.args is None else launch.args.external_id)
        if rpc is None:
            rpc = self._enclosing(launch)
        return None if rpc is None else (rpc.args or _NO_ARGS)

    def _group(self, meta: EventArgs) -> tuple[GroupInfo, str, str]:
        # Keyed by the JSON text of the args that name the group: exact (1 and true differ)
        # and fine for lists, which are not hashable.
        named_by = (
            meta.pg_name,
            meta.pg_desc,
            meta.group_size,
            meta.pg_ranks,
            meta.global_rank_start,
            meta.global_rank_stride,
        )
        try:
            key: bytes | None = _encode(named_by)
        except (TypeError, msgspec.EncodeError):  # a non-JSON value in a dict built in memory
            key = None
        resolved = None if key is None else self._group_cache.get(key)
        if resolved is None:
            group = group_from_args(meta, self.groups)
            resolved = (group, self.view.axis(group), self.view.tier(group.ranks, group.size))
            if key is not None:
                self._group_cache[key] = resolved
        return resolved

    def activity(
        self, kernel: Event, launch: Event | None, start: float, end: float
    ) -> CommActivity:
        meta = self.metadata(kernel, launch)
        duration = float(kernel.dur)
        if meta is None:
            return CommActivity(
                start=start,
                end=end,
                duration=duration,
                op=op_from_kernel_name(kernel.name),
                axis=AXIS_UNKNOWN,
                tier=TIER_UNKNOWN,
                group_size=None,
                bytes=None,
            )
        group, axis, tier = self._group(meta)
        name = meta.collective_name
        op = normalise_op("" if name is None else str(name))
        if op is None:
            op = op_from_kernel_name(kernel.name)
        size_of = dtype_size(meta.dtype)
        n_in, n_out = meta.in_msg_nelems, meta.out_msg_nelems
        counts = [n for n in (n_in, n_out) if isinstance(n, int) and not isinstance(n, bool)]
        # nccl-tests S: the full array, i.e. the larger of input and output (all_gather's
        # gathered output, reduce_scatter's full input, the buffer itself otherwise).
        size = max(counts) * size_of if counts and size_of is not None else None
        return CommActivity(
            start=start,
            end=end,
            duration=duration,
            op=op,
            axis=axis,
            tier=tier,
            group_size=group.size,
            bytes=size,
        )


def _launches_by_correlation(runtime: list[Event]) -> dict[Any, Event]:
    """The host launch of each correlation id (a later duplicate wins, as a dict build does)."""
    try:  # all in C: every runtime event Kineto writes has args
        launches = dict(zip(map(_CORRELATION, runtime), runtime, strict=True))
    except AttributeError:  # some event without args
        launches = {
            args.correlation: event for event in runtime if (args := event.args) is not None
        }
    launches.pop(None, None)  # no correlation id links nothing
    return launches


def gpu_timeline(
    trace: KinetoTrace,
    scanned: ScannedEvents,
    *,
    rank: int,
    world_size: int,
    clock_offset_s: float,
    gpus_per_node: int | None,
    host_of_rank: Mapping[int, str] | None,
    axis_overrides: Mapping[str, str],
) -> Timeline:
    steps = profiler_steps(scanned)
    step_starts = [s.start for s in steps]
    step_ends = [s.end for s in steps]
    n_steps = len(steps)
    dist = trace.distributed_info or {}
    view = TopologyView(
        world_size=world_size,
        gpus_per_node=gpus_per_node if gpus_per_node is not None else DEFAULT_GPUS_PER_NODE,
        host_of_rank=host_of_rank,
        axis_overrides=axis_overrides,
    )
    resolver = _CommResolver(scanned, view, ProcessGroups(dist.get("pg_config")))
    recompute = recompute_ranges(scanned)
    pid = _device_pid(scanned)

    launches = _launches_by_correlation(scanned.runtime)

    inf = float("inf")
    first_start = [inf] * n_steps
    last_end = [-inf] * n_steps
    compute: list[Interval] = []
    recomputed: list[Interval] = []
    other: list[Interval] = []
    comms: list[CommActivity] = []
    get_launch = launches.get
    bisect_right = bisect.bisect_right
    comm_cache = _comm_name_cache
    has_recompute = bool(recompute)
    # Device events of one step come in runs: try the previous event's step before bisecting.
    # Step i holds launch time t when it is the latest step with start <= t and t <= its end.
    i = -1
    lo, hi, following = inf, -inf, inf

    for events, is_kernel in ((scanned.kernels, True), (scanned.memops, False)):
        for event in events:
            if event.pid != pid:
                continue
            start = event.ts
            end = start + event.dur
            args = event.args
            launch = None if args is None else get_launch(args.correlation)
            if launch is not None:
                launched_at = launch.ts
                if not (lo <= launched_at < following):
                    i = bisect_right(step_starts, launched_at) - 1
                    lo, hi = (step_starts[i], step_ends[i]) if i >= 0 else (-inf, -inf)
                    following = step_starts[i + 1] if i + 1 < n_steps else inf
                if launched_at <= hi:
                    if start < first_start[i]:
                        first_start[i] = start
                    if end > last_end[i]:
                        last_end[i] = end
            if not is_kernel:
                other.append((start, end))
                continue
            name = event.name
            is_comm = comm_cache.get(name)
            if is_comm is None:
                is_comm = is_comm_kernel(name)
            if is_comm:
                comms.append(resolver.activity(event, launch, start, end))
            elif has_recompute and launch is not None and recompute.contains(launch.tid, launch.ts):
                recomputed.append((start, end))
            else:
                compute.append((start, end))

    windows: list[StepWindow] = []
    live = [i for i in range(n_steps) if first_start[i] < inf]
    previous_end = -inf
    for position, i in enumerate(live):
        # Clipping to the previous window keeps windows disjoint even if a later step's first
        # device event starts before an earlier one's (possible across streams).
        start = max(first_start[i], previous_end)
        end = first_start[live[position + 1]] if position + 1 < len(live) else last_end[i]
        if end > start:
            windows.append(StepWindow(steps[i].step, start, end))
            previous_end = end
    return Timeline(
        rank=rank,
        world_size=world_size,
        device=_device_name(trace, pid),
        clock_offset_s=clock_offset_s,
        windows=tuple(windows),
        compute=compute,
        recompute=recomputed,
        other=other,
        comms=tuple(comms),
    )
