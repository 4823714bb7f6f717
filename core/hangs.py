"""Hang and desync attribution: which ranks a blocked job waits for (docs/definitions.md#hangs).

Every rank reports, per process group, the highest collective sequence number it entered and the
oldest collective it entered and has not completed, with how long it has waited
(`GroupProgress`). A collective completes only once every rank of its group has entered it, so
when ranks wait in collective N of a group:

- a rank of that group whose highest entered sequence number is below N *never joined* N: the
  job waits for it. If that rank is itself waiting in another group's collective it is a victim,
  not the cause: the cause is found in that other group. Ranks that never joined and wait nowhere
  are the suspects (reason ``not_joined``);
- ranks of one group waiting at the same N in different ops disagree about the program: the ranks
  in the less common op are suspects (reason ``desync``); so are the ranks of a cycle (each waits
  for another that waits for it: the ranks called the groups' collectives in different orders).

A rank counts as *blocked* once its oldest open collective has waited `BLOCKED_AFTER_S`: shorter
waits are ordinary collectives in flight. Waits are extrapolated from the rank's last status by
the time since it arrived; a status older than `STALE_STATUS_INTERVALS` of the rank's reporting
interval is stale (its process likely died): it still says what the rank entered, but the rank
no longer counts as waiting. Ranks whose agent closed (a normal end) wait for nothing.

**Across collectors** (per-node sidecars, docs/fleet.md#hangs-across-sidecars): one collector sees
only its own ranks, so the join above can miss the rank a group waits for when that rank reports
elsewhere. `progress_export` says what each collector exports so that a Prometheus or
VictoriaMetrics rule does the same join over every collector's series: per ``(group, seq, op)``
its blocked ranks wait in, and the progress (highest entered sequence number per group) of its
ranks that are not blocked but whose step is overdue (`step_overdue`) or that share the collector
with a blocked rank. A stalled rank is not blocked (it waits in no collective), so its overdue
step is what makes its progress reach the rule; a rank that never reported a step is overdue from
its first report on (a startup hang), and its agent reports every group it belongs to from the
start, so a group it never entered shows it behind. Both exist only while something is overdue or
waits: a hang of N ranks over S collectors exports at most ``2 * S * groups`` wait series plus one
progress series per group of each rank that is not blocked (the stalled ones).
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from mfuscope.core.collective_records import GroupProgress

__all__ = [
    "BLOCKED_AFTER_S",
    "OVERDUE_AFTER_S",
    "OVERDUE_STEPS",
    "STALE_STATUS_INTERVALS",
    "BlockedOp",
    "GroupWait",
    "HangView",
    "ProgressExport",
    "RankComm",
    "RankProgress",
    "Suspect",
    "find_hangs",
    "progress_export",
    "step_overdue",
]

BLOCKED_AFTER_S = 10.0
STALE_STATUS_INTERVALS = 3.0
# A rank's step is overdue once no step of it has arrived for this long (s), or for
# `OVERDUE_STEPS` of its recent step time when that is longer: well past a batch flush (5 s) and
# a collective read (5 s) of a healthy rank, early enough that a stalled rank's progress reaches
# the rules before the hang alert (60 s of waiting) goes out.
OVERDUE_AFTER_S = 20.0
OVERDUE_STEPS = 3.0


def step_overdue(since_step_s: float | None, step_s: float | None) -> bool:
    """Whether a rank whose latest step arrived `since_step_s` ago, with recent step time
    `step_s` (s; None: unknown), is overdue. A rank that has reported no step yet counts from
    its first report: one stuck before its first step (the process group's first collective,
    NCCL's set-up) is overdue like a stalled one, so its progress reaches the cross-collector
    join. None: nothing known, not overdue."""
    if since_step_s is None:
        return False
    return since_step_s > max(OVERDUE_AFTER_S, OVERDUE_STEPS * (step_s or 0.0))


@dataclass(frozen=True)
class RankComm:
    """One rank's latest progress report. `age_s`: time since it arrived; `interval_s`: how often
    the rank reports while blocked; `closed`: its agent closed; `overdue`: its step is overdue
    (`step_overdue`)."""

    rank: int
    host: str
    node: str
    groups: tuple[GroupProgress, ...]
    age_s: float
    interval_s: float
    closed: bool = False
    overdue: bool = False

    @property
    def stale(self) -> bool:
        return self.age_s > STALE_STATUS_INTERVALS * self.interval_s


@dataclass(frozen=True)
class BlockedOp:
    """Ranks blocked in one ``(axis, tier, op)``: how many, and the longest wait (s). A rank
    counts once, under its longest-waiting collective."""

    axis: str
    tier: str
    op: str
    ranks: int
    waited_s: float


@dataclass(frozen=True)
class Suspect:
    """A rank the blocked ranks wait for: in `op` number `seq` of a group on `axis`/`tier`,
    `waiting` ranks have waited up to `waited_s` for it. `reason`: ``not_joined`` or ``desync``."""

    rank: int
    host: str
    node: str
    op: str
    seq: int
    axis: str
    tier: str
    reason: str
    waiting: int
    waited_s: float


@dataclass(frozen=True)
class HangView:
    """The job's blocked ranks by op, and its suspects (the first `max_suspects` by ranks
    waiting on them; `suspects_total` counts all)."""

    blocked: tuple[BlockedOp, ...]
    suspects: tuple[Suspect, ...]
    suspects_total: int


@dataclass(frozen=True)
class _Wait:
    rank: int
    group: GroupProgress
    waited_s: float


def _waits(ranks: Iterable[RankComm]) -> dict[int, list[_Wait]]:
    """Per live rank, its blocked collectives (one per group)."""
    waits: dict[int, list[_Wait]] = {}
    for r in ranks:
        if r.closed or r.stale:
            continue
        for g in r.groups:
            if g.pending is None:
                continue
            waited = g.pending.waited_s + max(r.age_s, 0.0)
            if waited >= BLOCKED_AFTER_S:
                waits.setdefault(r.rank, []).append(_Wait(r.rank, g, waited))
    return waits


def _blocked(waits: dict[int, list[_Wait]]) -> tuple[BlockedOp, ...]:
    counts: dict[tuple[str, str, str], list[float]] = {}
    for rank_waits in waits.values():
        longest = max(rank_waits, key=lambda w: w.waited_s)
        pending = longest.group.pending
        assert pending is not None
        key = (longest.group.axis, longest.group.tier, pending.op)
        counts.setdefault(key, []).append(longest.waited_s)
    return tuple(
        BlockedOp(axis, tier, op, len(values), max(values))
        for (axis, tier, op), values in sorted(counts.items())
    )


def _named(base: Suspect, rank: RankComm, reason: str) -> Suspect:
    return dataclasses.replace(base, rank=rank.rank, host=rank.host, node=rank.node, reason=reason)


def _on_cycles(victims: set[int], waits_for: dict[int, set[int]], limit: int = 256) -> set[int]:
    """The victims that wait, through other victims, for themselves (ranks in a cycle)."""
    if len(victims) > limit:
        return set()
    cycled = set()
    for start in victims:
        seen: set[int] = set()
        stack = [u for u in waits_for.get(start, ()) if u in victims]
        while stack:
            rank = stack.pop()
            if rank == start:
                cycled.add(start)
                break
            if rank not in seen:
                seen.add(rank)
                stack.extend(u for u in waits_for.get(rank, ()) if u in victims)
    return cycled


def find_hangs(ranks: Sequence[RankComm], max_suspects: int = 8) -> HangView:
    """Blocked ranks and suspects of one job (see the module docstring)."""
    waits = _waits(ranks)
    if not waits:
        return HangView((), (), 0)
    by_rank = {r.rank: r for r in ranks}
    # (group, seq) -> the waits on it
    on: dict[tuple[str, int], list[_Wait]] = {}
    for rank_waits in waits.values():
        for w in rank_waits:
            assert w.group.pending is not None
            on.setdefault((w.group.group, w.group.pending.seq), []).append(w)
    # group -> its ranks and their progress on it (each rank reports a few groups)
    members: dict[str, list[tuple[RankComm, GroupProgress]]] = {}
    for r in ranks:
        for g in r.groups:
            members.setdefault(g.group, []).append((r, g))
    found: dict[int, Suspect] = {}
    victims: dict[int, Suspect] = {}  # never joined, but blocked elsewhere
    waits_for: dict[int, set[int]] = {}  # blocked rank -> the ranks it waits for
    for (group, seq), waiting in sorted(on.items()):
        first = waiting[0].group
        ops = Counter(w.group.pending.op for w in waiting if w.group.pending is not None)
        op = sorted(ops.items(), key=lambda kv: (-kv[1], kv[0]))[0][0]
        base = Suspect(
            -1,
            "",
            "",
            op,
            seq,
            first.axis,
            first.tier,
            "",
            len(waiting),
            max(w.waited_s for w in waiting),
        )
        for w in waiting:  # the minority op at this seq
            if w.group.pending is not None and w.group.pending.op != op:
                found.setdefault(w.rank, _named(base, by_rank[w.rank], "desync"))
        for r, progress in members.get(group, ()):
            if progress.entered_seq >= seq:
                continue
            for w in waiting:
                waits_for.setdefault(w.rank, set()).add(r.rank)
            if r.rank in waits:  # waiting elsewhere: a victim, unless it closes a cycle
                victims.setdefault(r.rank, _named(base, r, "desync"))
            else:
                found.setdefault(r.rank, _named(base, r, "not_joined"))
    if not found:
        for rank in _on_cycles(set(victims), waits_for):
            found[rank] = victims[rank]
    ordered = sorted(found.values(), key=lambda s: (-s.waiting, s.rank))
    return HangView(_blocked(waits), tuple(ordered[:max_suspects]), len(ordered))


@dataclass(frozen=True)
class GroupWait:
    """Blocked ranks of one collector waiting in collective `seq` (`op`) of `group`: how many and
    the longest wait (s)."""

    group: str
    seq: int
    op: str
    axis: str
    tier: str
    ranks: int
    waited_s: float


@dataclass(frozen=True)
class RankProgress:
    """The highest collective sequence number `rank` entered in `group`."""

    rank: int
    host: str
    node: str
    group: str
    axis: str
    tier: str
    entered_seq: int


@dataclass(frozen=True)
class ProgressExport:
    """What one collector exports for the cross-collector join (see the module docstring)."""

    waits: tuple[GroupWait, ...]
    progress: tuple[RankProgress, ...]


def progress_export(ranks: Sequence[RankComm]) -> ProgressExport:
    """The waits of the blocked ranks among `ranks`, and the progress of those not blocked that
    are overdue or share the collector with a blocked rank. Groups of one rank cannot hang and are
    left out; so are closed ranks."""
    waits = _waits(ranks)
    on: dict[tuple[str, int, str], list[_Wait]] = {}
    for rank_waits in waits.values():
        for w in rank_waits:
            assert w.group.pending is not None
            on.setdefault((w.group.group, w.group.pending.seq, w.group.pending.op), []).append(w)
    group_waits = tuple(
        GroupWait(
            group,
            seq,
            op,
            found[0].group.axis,
            found[0].group.tier,
            len(found),
            max(w.waited_s for w in found),
        )
        for (group, seq, op), found in sorted(on.items())
    )
    progress = tuple(
        RankProgress(r.rank, r.host, r.node, g.group, g.axis, g.tier, g.entered_seq)
        for r in sorted(ranks, key=lambda r: r.rank)
        if not r.closed and r.rank not in waits and (r.overdue or waits)
        for g in r.groups
        if g.size is None or g.size > 1
    )
    return ProgressExport(group_waits, progress)
