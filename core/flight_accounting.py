"""What a rank's flight-recorder entries add up to: traffic totals, progress per process group and
arrival samples (pure bookkeeping over `FlightEntry`; the agent's reader thread drives it).

- `TrafficTotals`: cumulative calls, nccl-tests size S and, where the backend timed the op, its
  duration, per ``(op, axis, tier, group_size)``: the always-on source of the collective traffic
  counters (docs/definitions.md#collective-records). Barriers and ops without a single op name
  (``coalesced``) move no attributable data and are left out, as profiled windows leave them out.
- `GroupProgress` (via `ProgressTracker`): per group the highest collective sequence number this
  rank entered and completed, and the oldest one it entered and has not completed: what it waits
  in (docs/definitions.md#hangs). Point-to-point ops have their own sequence and are left out.
- `ArrivalSampler`: per group, the first collective of each step that completed here, with its
  enqueue time: every rank picks the same sequence number (the same program runs the same
  collectives in each step), so the collector can join them (docs/definitions.md#arrival-skew).
- `StepDurations`: where the backend times ops, per step the seconds of the collectives it
  enqueued per ``(op, axis, tier)``, handed on once every collective of the step is in: what the
  steps between profiled windows carry their exposed communication from
  (docs/definitions.md#carried-gpu-steps).
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from mfuscope.core.collective_records import (
    PENDING_OPS,
    ArrivalSample,
    CollectiveTraffic,
    GroupProgress,
    PendingCollective,
)
from mfuscope.core.flight_records import BARRIER, FlightEntry
from mfuscope.core.vocabulary import COLLECTIVE_OPS

__all__ = [
    "ArrivalSampler",
    "GroupName",
    "GroupNames",
    "ProgressTracker",
    "StepDurations",
    "StepDurationsUpdate",
    "TrafficTotals",
]


@dataclass(frozen=True)
class GroupName:
    """How mfuscope names a process group: its axis, its tier and its size (None: unknown)."""

    axis: str
    tier: str
    size: int | None


# (group name, group description) -> its names.
GroupNames = Callable[[str, str], GroupName]

_TrafficKey = tuple[str, str, str, int | None]


class TrafficTotals:
    """Cumulative traffic per ``(op, axis, tier, group_size)``."""

    def __init__(self) -> None:
        # key -> [calls, bytes, seconds, sized_seconds, sized_bytes]
        self._totals: dict[_TrafficKey, list[float]] = {}
        self.skipped = 0  # done entries with no op to count them under

    def add(self, entries: Iterable[FlightEntry], names: GroupNames) -> None:
        for entry in entries:
            if entry.op is None or entry.op not in COLLECTIVE_OPS:
                if entry.op != BARRIER:
                    self.skipped += 1
                continue
            name = names(entry.group, entry.group_desc)
            key = (entry.op, name.axis, name.tier, name.size)
            acc = self._totals.get(key)
            if acc is None:
                acc = self._totals[key] = [0, 0, 0.0, 0.0, 0]
            acc[0] += 1
            if entry.size_bytes is not None:
                acc[1] += entry.size_bytes
            if entry.duration_s is not None:
                acc[2] += entry.duration_s
                if entry.size_bytes is not None:
                    acc[3] += entry.duration_s
                    acc[4] += entry.size_bytes

    def records(self) -> tuple[CollectiveTraffic, ...]:
        return tuple(
            CollectiveTraffic(
                op=op,
                axis=axis,
                tier=tier,
                group_size=size,
                calls=int(acc[0]),
                bytes=int(acc[1]),
                seconds=float(acc[2]),
                sized_seconds=float(acc[3]),
                sized_bytes=int(acc[4]),
            )
            for (op, axis, tier, size), acc in sorted(
                self._totals.items(), key=lambda item: (item[0][:3], item[0][3] or 0)
            )
        )


@dataclass(frozen=True)
class OpenCollective:
    """The oldest collective a group has open on this rank (enqueued, not done)."""

    seq: int
    op: str
    bytes: int | None
    created_unix_ns: int


class _Group:
    __slots__ = ("completed", "desc", "entered")

    def __init__(self, desc: str) -> None:
        self.desc = desc
        self.entered = 0
        self.completed = 0


class ProgressTracker:
    """Per process group: highest collective sequence number entered and completed here, and the
    oldest one open (from the latest dump's open entries). `known`: (name, description) of the
    groups the rank belongs to, reported from the start with nothing entered: a rank stuck before
    its first collective on a group (its first step, NCCL's set-up at a group's first collective)
    is then behind the ranks waiting there (docs/definitions.md#hangs)."""

    def __init__(self, known: Iterable[tuple[str, str]] = ()) -> None:
        self._groups: dict[str, _Group] = {name: _Group(desc) for name, desc in known}
        self._open: dict[str, OpenCollective] = {}

    def observe(self, done: Iterable[FlightEntry], still_open: Iterable[FlightEntry]) -> None:
        """Take one dump's done entries and *all* its open entries (they replace the last)."""
        for entry in done:
            if not entry.is_p2p:
                group = self._group(entry)
                group.entered = max(group.entered, entry.seq)
                group.completed = max(group.completed, entry.seq)
        oldest: dict[str, OpenCollective] = {}
        for entry in still_open:
            if entry.is_p2p:
                continue
            group = self._group(entry)
            group.entered = max(group.entered, entry.seq)
            known = oldest.get(entry.group)
            if known is None or entry.seq < known.seq:
                op = entry.op if entry.op in PENDING_OPS else "other"
                oldest[entry.group] = OpenCollective(
                    entry.seq, op, entry.size_bytes, entry.created_unix_ns
                )
        self._open = oldest

    def _group(self, entry: FlightEntry) -> _Group:
        group = self._groups.get(entry.group)
        if group is None:
            group = self._groups[entry.group] = _Group(entry.group_desc)
        return group

    def records(self, names: GroupNames, now_unix_ns: int) -> tuple[GroupProgress, ...]:
        """Every group seen, with its open collective's wait measured up to `now_unix_ns`."""
        out = []
        for key in sorted(self._groups):
            group = self._groups[key]
            name = names(key, group.desc)
            held = self._open.get(key)
            pending = None
            if held is not None:
                pending = PendingCollective(
                    seq=held.seq,
                    op=held.op,
                    bytes=held.bytes,
                    waited_s=max(now_unix_ns - held.created_unix_ns, 0) / 1e9,
                )
            out.append(
                GroupProgress(
                    group=key,
                    axis=name.axis,
                    tier=name.tier,
                    size=name.size,
                    entered_seq=group.entered,
                    completed_seq=min(group.completed, group.entered),
                    pending=pending,
                )
            )
        return tuple(out)


class ArrivalSampler:
    """Per group, the first completed collective of each step (see the module docstring).

    `step_starts` are ``(step, start_unix_ns)`` in step order, on the clock the recorder stamps
    enqueue times with (the host's wall clock); an entry belongs to the last step that started at
    or before its enqueue time."""

    def __init__(self, max_kept: int = 4_096) -> None:
        self._last_step: dict[str, int] = {}
        self._max = max_kept
        self.samples: list[ArrivalSample] = []
        self._first = 0  # the running number of `samples[0]` (older ones were trimmed)

    def observe(self, done: Sequence[FlightEntry], step_starts: Sequence[tuple[int, int]]) -> None:
        if not step_starts:
            return
        starts = [start for _, start in step_starts]
        for entry in sorted(
            (e for e in done if not e.is_p2p and e.op in COLLECTIVE_OPS),
            key=lambda e: (e.group, e.seq),
        ):
            index = bisect.bisect_right(starts, entry.created_unix_ns) - 1
            if index < 0:
                continue
            step = step_starts[index][0]
            if step <= self._last_step.get(entry.group, -1):
                continue
            self._last_step[entry.group] = step
            self.samples.append(ArrivalSample(entry.group, entry.seq, entry.created_unix_ns))
        if len(self.samples) > self._max:  # unread for long (no collector): keep the newest
            trimmed = len(self.samples) - self._max
            del self.samples[:trimmed]
            self._first += trimmed

    def since(self, cursor: int) -> tuple[tuple[ArrivalSample, ...], int]:
        """The samples after running number `cursor` (a reader's position; 0 at first) and the
        new position: each reader gets every sample once, whatever the others read."""
        start = max(cursor - self._first, 0)
        return tuple(self.samples[start:]), self._first + len(self.samples)


# (op, axis, tier) -> seconds
ClassSeconds = dict[tuple[str, str, str], float]


@dataclass(frozen=True)
class StepDurationsUpdate:
    """What `StepDurations.take` hands on. `timed`: the backend times ops here (entries with
    durations were seen); `through`: every step up to it is complete (None: none yet); `steps`:
    the steps completed since the last take, each with its seconds per (op, axis, tier) (empty:
    the step ran no collective), or None when they are not all known (an op without a duration,
    entries lost to the ring)."""

    timed: bool = False
    through: int | None = None
    steps: Mapping[int, Mapping[tuple[str, str, str], float] | None] = field(default_factory=dict)


class StepDurations:
    """Per step, the seconds of the collectives it enqueued (see the module docstring).

    An entry belongs to the last step that started at or before its enqueue time, as in
    `ArrivalSampler`. A step is complete once a dump taken after the next step began (so every
    collective the step enqueued is in it) holds none of its collectives still open. The
    nccl-tests ops count; a barrier does not (it moves no data: windows leave it out of their
    collectives too); a step with an op the recorder does not name (``nccl:coalesced``) or
    without a duration is not all known."""

    def __init__(self, max_steps: int = 4_096) -> None:
        self._max = max_steps
        self._seconds: dict[int, ClassSeconds] = {}
        self._unknown: set[int] = set()  # steps with an op not timed, or entries lost
        self._through: int | None = None
        self._complete: list[int] = []  # completed, not taken yet, in order
        self.timed = False

    def add(
        self,
        done: Iterable[FlightEntry],
        step_starts: Sequence[tuple[int, int]],
        names: GroupNames,
    ) -> None:
        """Count completed entries (`step_starts`: ``(step, start_unix_ns)`` in step order)."""
        starts = [start for _, start in step_starts]
        for entry in done:
            if entry.op == BARRIER:
                continue
            index = bisect.bisect_right(starts, entry.created_unix_ns) - 1
            if index < 0:
                continue
            step = step_starts[index][0]
            if self._through is not None and step <= self._through:
                continue  # already handed on (an entry stamped by a clock that stepped back)
            if entry.duration_s is None or entry.op not in COLLECTIVE_OPS:
                self._unknown.add(step)
                continue
            self.timed = True
            if step not in self._seconds and len(self._seconds) >= self._max:
                # Steps that never complete (no dump after them): drop the oldest.
                del self._seconds[min(self._seconds)]
            name = names(entry.group, entry.group_desc)
            per_step = self._seconds.setdefault(step, {})
            key = (entry.op, name.axis, name.tier)
            per_step[key] = per_step.get(key, 0.0) + entry.duration_s

    def advance(
        self,
        still_open: Iterable[FlightEntry],
        step_starts: Sequence[tuple[int, int]],
        dumped_unix_ns: int,
        lost: int = 0,
    ) -> None:
        """After a dump taken at `dumped_unix_ns` whose open entries are `still_open`: mark
        complete the steps it holds whole. `lost`: entries the ring overwrote unread since the
        previous dump (the steps they may belong to are not all known)."""
        through = self._through
        if lost:  # entries older than the dump's oldest: of any step not complete yet
            self._unknown.update(s for s, _ in step_starts if through is None or s > through)
        starts = [start for _, start in step_starts]
        # The steps whose successor began before the dump.
        last = bisect.bisect_right(starts, dumped_unix_ns) - 2
        for entry in still_open:
            if entry.op != BARRIER:
                index = bisect.bisect_right(starts, entry.created_unix_ns) - 1
                if index >= 0:
                    last = min(last, index - 1)
        if last >= 0:
            self._mark([s for s, _ in step_starts[: last + 1] if through is None or s > through])

    def complete_all(self, step_starts: Sequence[tuple[int, int]]) -> None:
        """No step begins any more and no collective is open (the agent's close): every step
        of `step_starts` is complete."""
        through = self._through
        self._mark([s for s, _ in step_starts if through is None or s > through])

    def _mark(self, newly: list[int]) -> None:
        if not newly:
            return
        self._complete.extend(newly)
        self._through = newly[-1]
        excess = len(self._complete) - self._max
        if excess > 0:  # not taken for long: keep the newest
            for step in self._complete[:excess]:
                self._seconds.pop(step, None)
                self._unknown.discard(step)
            del self._complete[:excess]

    def take(self) -> StepDurationsUpdate:
        """The steps completed since the last take (each handed on once)."""
        steps: dict[int, Mapping[tuple[str, str, str], float] | None] = {}
        for step in self._complete:
            seconds = self._seconds.pop(step, {})
            steps[step] = None if step in self._unknown else seconds
            self._unknown.discard(step)
        self._complete.clear()
        return StepDurationsUpdate(self.timed, self._through, steps)
