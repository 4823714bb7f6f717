"""GPU traces (NCCL / RCCL): device events -> the normalised `Timeline`.

The device timeline is every kernel, memcpy and memset on the rank's device (all streams).
A device event is linked to the host call that launched it by its ``correlation`` id (the
flow events ``ac2g`` / ``async_cpu_to_gpu`` are absent from some traces; the id never is).

Step windows (docs/analyze.md#definitions): step N's window starts when the first device event
*launched inside* the CPU ``ProfilerStep#N`` range starts on the device, and ends when step N+1's
window starts; the last step ends when the last device event launched inside it ends. Steps that
launched nothing are skipped. Without profiler steps, windows are chosen as
`_windows` says.
"""

from __future__ import annotations

import bisect
import math
import operator
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from itertools import repeat
from typing import Any

import msgspec
import numpy as np
from mfuscope.core.errors import TraceError
from mfuscope.core.trace import _read_names
from mfuscope.core.trace._coalesced import CoalescedBatches
from mfuscope.core.trace._collectives import (
    GroupInfo,
    ProcessGroups,
    TopologyView,
    dtype_size,
    group_from_args,
    normalise_op,
    op_from_kernel_name,
)
from mfuscope.core.trace._columns import (
    DeviceColumns,
    EventColumns,
    LaunchIndex,
)
from mfuscope.core.trace._events import EventArgs, KinetoTrace
from mfuscope.core.trace._intervals import FloatArray, Spans
from mfuscope.core.trace._recompute import RecomputeRanges, recompute_ranges
from mfuscope.core.trace._scan import Event, ScannedEvents, named
from mfuscope.core.trace._steps import CpuStep
from mfuscope.core.trace._trace_model import (
    CommActivity,
    RankContext,
    StepWindow,
    Timeline,
)
from mfuscope.core.trace._windows import choose_windows
from mfuscope.core.trace.kernel_classes import class_code, family_code, is_communication_kernel
from mfuscope.core.vocabulary import AXIS_UNKNOWN, TIER_UNKNOWN
from numpy.typing import NDArray

__all__ = ["COMM_KERNEL_SUBSTRINGS", "OPERATOR_PREFIXES", "gpu_timeline", "is_comm_kernel"]

DEFAULT_GPUS_PER_NODE = 8  # a GPU trace's ranks per host unless told (`build_timeline`)
# A communication kernel's lower-cased name holds one of COMM_KERNEL_SUBSTRINGS (the
# selection keeps those decoded); they live in `_read_names`, numpy-free, for the selection.
COMM_KERNEL_SUBSTRINGS = _read_names.COMM_KERNEL_SUBSTRINGS
_RECORD_PARAM_COMMS = _read_names.RECORD_PARAM_COMMS
OPERATOR_PREFIXES = _read_names.TIMELINE_OPERATOR_PREFIXES  # the operators a GPU timeline reads
_PID = operator.attrgetter("pid")
_TID = operator.attrgetter("tid")
_TS = operator.attrgetter("ts")
_DUR = operator.attrgetter("dur")
_NAME = operator.attrgetter("name")
_CORRELATION = operator.attrgetter("args.correlation")
_NO_ARGS = EventArgs()
_NO_METADATA = "neither the kernel nor a record_param_comms around its launch gives the group"
_NO_GROUP_SIZE = "the collective's metadata does not give its group size"
_encode = msgspec.json.Encoder().encode


# Whether a kernel is communication (NCCL / RCCL, symmetric-memory and custom all-reduce
# kernels, NVSHMEM, ...): `kernel_classes` decides, and caches per distinct name.
is_comm_kernel = is_communication_kernel


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

    def __init__(
        self,
        scanned: ScannedEvents,
        view: TopologyView,
        groups: ProcessGroups,
        comm_launches: Sequence[Event | None] = (),
    ) -> None:
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
        self.coalesced = CoalescedBatches(
            scanned.annotations, self.by_thread, self.starts, comm_launches
        )

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

    def activities(
        self, kernel: Event, launch: Event | None, start: float, end: float
    ) -> tuple[CommActivity, ...]:
        """The kernel's collective; for a coalesced p2p batch (`_coalesced`), one activity per
        op of the batch (``send``, ``recv``) over the kernel's whole interval, with the bytes of
        that op's members summed: they run at once, in the one kernel."""
        meta = self.metadata(kernel, launch)
        members = self.coalesced.members(launch) if meta is None else ()
        if not members:
            return (self.activity(kernel, meta, start, end),)
        by_op: dict[str | None, list[EventArgs]] = {}
        for member in members:
            by_op.setdefault(normalise_op(str(member.collective_name)), []).append(member)
        return tuple(
            msgspec.structs.replace(
                self.activity(kernel, same_op[0], start, end),
                bytes=_summed(map(_message_bytes, same_op)),
            )
            for same_op in by_op.values()
        )

    def activity(
        self, kernel: Event, meta: EventArgs | None, start: float, end: float
    ) -> CommActivity:
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
                group_unknown_reason=_NO_METADATA,
            )
        group, axis, tier = self._group(meta)
        name = meta.collective_name
        op = normalise_op("" if name is None else str(name))
        if op is None:
            op = op_from_kernel_name(kernel.name)
        return CommActivity(
            start=start,
            end=end,
            duration=duration,
            op=op,
            axis=axis,
            tier=tier,
            group_size=group.size,
            bytes=_message_bytes(meta),
            group_unknown_reason=None if group.size is not None else _NO_GROUP_SIZE,
        )


def _message_bytes(meta: EventArgs) -> int | None:
    """nccl-tests S: the full array, i.e. the larger of input and output (all_gather's gathered
    output, reduce_scatter's full input, the buffer itself otherwise); None when unknown."""
    size_of = dtype_size(meta.dtype)
    n_in, n_out = meta.in_msg_nelems, meta.out_msg_nelems
    counts = [n for n in (n_in, n_out) if isinstance(n, int) and not isinstance(n, bool)]
    return max(counts) * size_of if counts and size_of is not None else None


def _summed(sizes: Iterable[int | None]) -> int | None:
    """The sum, None if any is unknown."""
    total = 0
    for size in sizes:
        if size is None:
            return None
        total += size
    return total


def _correlations(events: Sequence[Event]) -> list[Any]:
    """Each event's ``args.correlation`` (None without args), read in C when all have args."""
    try:
        return list(map(_CORRELATION, events))
    except AttributeError:  # some event without args
        return [None if (args := event.args) is None else args.correlation for event in events]


def _launch_index(runtime: list[Event]) -> dict[Any, int]:
    """Position in `runtime` of the host launch of each correlation id (a later duplicate
    wins, as a dict build does)."""
    launches = dict(zip(_correlations(runtime), range(len(runtime)), strict=True))
    launches.pop(None, None)  # no correlation id links nothing
    return launches


def _floats(events: Sequence[Event], field: operator.attrgetter[Any]) -> FloatArray:
    values = np.fromiter(map(field, events), dtype=np.float64, count=len(events))
    # numpy reads a missing value (None) as NaN, which JSON cannot hold: a malformed event.
    if np.isnan(values).any():
        raise TypeError(f"a device or runtime event without a number in {field!r}")
    return values


def _comm_and_class(
    kernels: Sequence[Event],
) -> tuple[NDArray[np.bool_], NDArray[np.int8], NDArray[np.int16]]:
    """Per kernel, from its name: whether it is communication, its class and family codes."""
    names = list(map(_NAME, kernels))
    return (
        np.fromiter(map(is_comm_kernel, names), bool, len(names)),
        np.fromiter(map(class_code, names), np.int8, len(names)),
        np.fromiter(map(family_code, names), np.int16, len(names)),
    )


class _DeviceEvents(msgspec.Struct, frozen=True):
    """The rank's kernels or memory ops: times, and the launch row of each (-1: none)."""

    starts: FloatArray
    ends: FloatArray
    launch: NDArray[np.intp]


class _Device(msgspec.Struct, frozen=True):
    """What the timeline needs of the rank's device: its events and their launches."""

    pid: Any
    kernels: _DeviceEvents
    memops: _DeviceEvents
    launch_ts: FloatArray  # per launch row, then NaN for row -1 (no launch)
    launch_tids: Callable[[], list[Any]]  # per launch row (read only when recompute is known)
    is_comm: NDArray[np.bool_]  # per kernel
    kernel_class: NDArray[np.int8]  # per kernel: position in kernel_classes.KERNEL_CLASSES
    kernel_family: NDArray[np.int16]  # per kernel: position in kernel_classes.FAMILY_NAMES
    comm_kernels: list[Event]  # the decoded kernels where is_comm, in order
    comm_launches: list[Event | None]  # and their decoded launches


def _device_from_events(scanned: ScannedEvents) -> _Device:
    """Everything read from the decoded events."""
    pid = _device_pid(scanned)
    runtime = scanned.runtime
    launch_index = _launch_index(runtime)

    def on_device(events: list[Event]) -> tuple[_DeviceEvents, list[Event]]:
        mine = np.fromiter(map(operator.eq, map(_PID, events), repeat(pid)), bool, len(events))
        chosen = np.fromiter(events, dtype=object, count=len(events))[mine]
        starts = _floats(chosen, _TS)
        launch = np.fromiter(
            map(launch_index.get, _correlations(chosen), repeat(-1)), np.intp, len(chosen)
        )
        return _DeviceEvents(starts, starts + _floats(chosen, _DUR), launch), chosen.tolist()

    kernels, kernel_events = on_device(scanned.kernels)
    memops, _ = on_device(scanned.memops)
    is_comm, kernel_class, kernel_family = _comm_and_class(kernel_events)
    comm_rows = np.flatnonzero(is_comm).tolist()
    return _Device(
        pid=pid,
        kernels=kernels,
        memops=memops,
        # NaN at position -1: "launched by nothing".
        launch_ts=np.append(_floats(runtime, _TS) if launch_index else np.empty(0), np.nan),
        launch_tids=lambda: list(map(_TID, runtime)),
        is_comm=is_comm,
        kernel_class=kernel_class,
        kernel_family=kernel_family,
        comm_kernels=[kernel_events[k] for k in comm_rows],
        comm_launches=[runtime[j] if j >= 0 else None for j in kernels.launch[comm_rows].tolist()],
    )


def _device_from_columns(columns: DeviceColumns, scanned: ScannedEvents) -> _Device:
    """The numbers from the columns; the decoded events only for communication kernels."""
    kernel_rows, memop_rows, launch_rows = columns.kernels, columns.memops, columns.launches
    pid = _most_common_pid((kernel_rows if len(kernel_rows) else memop_rows).pid)
    launches = LaunchIndex(launch_rows)
    kernel_launch = launches.lookup(kernel_rows)
    mine = kernel_rows.pid == pid

    def on_device(rows: EventColumns, launch: NDArray[np.intp]) -> _DeviceEvents:
        chosen = rows.pid == pid
        starts = rows.ts[chosen]
        return _DeviceEvents(starts, starts + rows.dur[chosen], launch[chosen])

    kernels = on_device(kernel_rows, kernel_launch)
    memops = on_device(memop_rows, launches.lookup(memop_rows))
    # Decoded kernels line up with the rows marked decoded; the others are no communication.
    decoded_rows = np.flatnonzero(kernel_rows.decoded)
    decoded_comm, decoded_class, decoded_family = _comm_and_class(scanned.kernels)
    comm_everywhere = np.zeros(len(kernel_rows), dtype=bool)
    comm_everywhere[decoded_rows] = decoded_comm
    comm_rows = np.flatnonzero(comm_everywhere & mine)
    # Classes: the names the selection read (by position in its list of distinct names),
    # and the decoded kernels' own names where it read none.
    by_name = np.array([*map(class_code, columns.kernel_names), class_code(None)], np.int8)
    kernel_class = by_name[kernel_rows.name]  # -1 (no name read) is the last: other
    kernel_class[decoded_rows] = decoded_class
    by_family = np.array([*map(family_code, columns.kernel_names), family_code(None)], np.int16)
    kernel_family = by_family[kernel_rows.name]  # -1 (no name read) is the last: unknown
    kernel_family[decoded_rows] = decoded_family
    decoded_position = (np.cumsum(kernel_rows.decoded) - 1)[comm_rows].tolist()
    # The selection keeps in the document every launch a decoded kernel names.
    comm_launch_rows = kernel_launch[comm_rows]
    named = comm_launch_rows[comm_launch_rows >= 0]
    if not launch_rows.decoded[named].all():
        raise TraceError(None, "the trace's device columns do not match its events")
    launch_position = np.cumsum(launch_rows.decoded) - 1
    runtime = scanned.runtime
    return _Device(
        pid=pid,
        kernels=kernels,
        memops=memops,
        launch_ts=np.append(launch_rows.ts, np.nan),
        launch_tids=lambda: launch_rows.tid.tolist(),
        is_comm=comm_everywhere[mine],
        kernel_class=kernel_class[mine],
        kernel_family=kernel_family[mine],
        comm_kernels=[scanned.kernels[i] for i in decoded_position],
        comm_launches=[
            runtime[launch_position[r]] if r >= 0 else None for r in comm_launch_rows.tolist()
        ],
    )


def _most_common_pid(pids: NDArray[np.int64]) -> int:
    """`_device_pid` on a column: the most frequent, the first seen among equals."""
    values, first, counts = np.unique(pids, return_index=True, return_counts=True)
    tied = counts == counts.max()
    return int(values[tied][np.argmin(first[tied])])


def _recomputed(
    device: _Device, candidates: NDArray[np.bool_], recompute: RecomputeRanges
) -> NDArray[np.bool_]:
    """Which `candidates` (kernels) were launched inside a recompute range of their launching
    thread."""
    kernel_launch = device.kernels.launch
    thread_code = {tid: code for code, tid in enumerate(recompute.by_thread)}
    tids = device.launch_tids()
    launch_thread = np.fromiter(map(thread_code.get, tids, repeat(-1)), np.intp, len(tids))
    thread = np.append(launch_thread, -1)[kernel_launch]  # launch -1: no thread
    launched_at = device.launch_ts[kernel_launch]
    out = np.zeros(len(candidates), dtype=bool)
    for tid, code in thread_code.items():
        chosen = candidates & (thread == code)
        out[chosen] = recompute.contains_each(tid, launched_at[chosen])
    return out


def _step_windows(
    steps: list[CpuStep], devices: tuple[_DeviceEvents, ...], runtime_ts: FloatArray
) -> tuple[StepWindow, ...]:
    """The step windows (see the module docstring): device events assigned to the step whose
    CPU range holds their launch, i.e. the latest step starting at or before the launch, if
    the launch is not after that step's end."""
    step_starts = np.array([step.start for step in steps])
    step_ends = np.array([step.end for step in steps])
    first_start = np.full(len(steps), np.inf)
    last_end = np.full(len(steps), -np.inf)
    for device in devices:
        launched = device.launch >= 0
        at = runtime_ts[device.launch[launched]]
        step = np.searchsorted(step_starts, at, side="right") - 1
        inside = (step >= 0) & (at <= step_ends[np.maximum(step, 0)])
        step = step[inside]
        np.minimum.at(first_start, step, device.starts[launched][inside])
        np.maximum.at(last_end, step, device.ends[launched][inside])

    windows: list[StepWindow] = []
    firsts, lasts = first_start.tolist(), last_end.tolist()
    live = [i for i, first in enumerate(firsts) if first < math.inf]
    previous_end = -math.inf
    for position, i in enumerate(live):
        # Clipping to the previous window keeps windows disjoint even if a later step's first
        # device event starts before an earlier one's (possible across streams).
        start = max(firsts[i], previous_end)
        end = firsts[live[position + 1]] if position + 1 < len(live) else lasts[i]
        if end > start:
            windows.append(StepWindow(steps[i].step, start, end))
            previous_end = end
    return tuple(windows)


def _span(devices: tuple[_DeviceEvents, ...]) -> tuple[float, float] | None:
    """(first start, last end) of the device events; None without any."""
    present = [d for d in devices if len(d.starts)]
    if not present:
        return None
    return (
        min(float(d.starts.min()) for d in present),
        max(float(d.ends.max()) for d in present),
    )


def gpu_timeline(trace: KinetoTrace, scanned: ScannedEvents, context: RankContext) -> Timeline:
    recompute = recompute_ranges(scanned)

    # Two builders of the same `_Device`: from the C selection's columns (most device events
    # never decoded), and from the decoded events where the selection is not built. The
    # selection is what makes the whole process 1.2-3.1x faster (`_select`'s docstring), so
    # both stay; test_select.py checks that both give the same analysis.
    if context.columns is not None:
        device = _device_from_columns(context.columns, scanned)
    else:
        device = _device_from_events(scanned)
    resolver = _CommResolver(scanned, context.view, context.groups, device.comm_launches)
    kernels, is_comm = device.kernels, device.is_comm
    device_events = (kernels, device.memops)
    windows = choose_windows(
        scanned,
        context.windows,
        lambda steps: _step_windows(steps, device_events, device.launch_ts),
        _span(device_events),
    )
    comms = tuple(
        activity
        for kernel, launch, start, end in zip(
            device.comm_kernels,
            device.comm_launches,
            kernels.starts[is_comm].tolist(),
            kernels.ends[is_comm].tolist(),
            strict=True,
        )
        for activity in resolver.activities(kernel, launch, start, end)
    )
    recomputed = np.zeros(len(is_comm), dtype=bool)
    if recompute:
        recomputed = _recomputed(device, ~is_comm & (kernels.launch >= 0), recompute)
    compute = ~is_comm & ~recomputed
    return Timeline(
        rank=context.rank,
        world_size=context.world_size,
        device=_device_name(trace, device.pid),
        clock_offset_s=context.clock_offset_s,
        windows=windows,
        compute=Spans(kernels.starts[compute], kernels.ends[compute]),
        recompute=Spans(kernels.starts[recomputed], kernels.ends[recomputed]),
        compute_class=device.kernel_class[compute],
        compute_family=device.kernel_family[compute],
        recompute_class=device.kernel_class[recomputed],
        other=Spans(device.memops.starts, device.memops.ends),
        comms=comms,
    )
