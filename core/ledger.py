"""The job-time ledger: where every second of every rank went (docs/definitions.md#job-time-ledger).

Each rank's time, from its process's start (the kernel's start time of the process) to its exit,
is split into `CATEGORIES`, which sum exactly to that span:

- ``startup``: from the process start to its first step, less the phases in it;
- ``step`` / ``redone_step``: the steps' periods (a step a restart ran again is redone);
- ``checkpoint_save``, ``checkpoint_load``, ``evaluation``, ``other_phase``: phases marked by
  ``agent.phase(name)`` or an integration; a phase is taken out of the period it falls in (the
  step before it, startup or shutdown), the rest of that period stays where it was;
- ``hung``: from the moment the rank is blocked in a collective by the hang rule
  (`core.hangs.BLOCKED_AFTER_S`) until it moves again or stops reporting;
- ``down``: from the end of the time a rank's process accounted for to its replacement's
  process start, on a restart (a new launch of the job);
- ``shutdown``: after the last step, until the agent closes, less the phases in it.

With ``down`` joining a rank's processes, its categories sum to the span from its first process's
start to its last one's end: its rank-seconds.

Who books what: the agent books its own process's ``startup``, phases and ``shutdown``
(`split_region`) and sends them as cumulative totals (`LedgerTotals`, wire schema 1.4); the
collector, and the report replaying the agents' batches, book the rest with `book_batch`: the
steps from the step reports, ``hung`` from the rank's collective progress, ``down`` when a
replacement process first reports. ``hung`` is time the rank spent inside something it reports
only later (a step, startup, a phase) or never (it died there): it is a debt that the rank's next
booked seconds pay first, so no second is counted twice.

Exactness: every figure is integer nanoseconds, from the agent's clock readings to the exported
counters (a step's ``wall_s`` is turned back into the nanoseconds it was computed from); the
categories add up as integers, exactly, and seconds appear only at export.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

from mfuscope.core._fields import Count, UnixNanos
from mfuscope.core.collective_records import GroupProgress
from mfuscope.core.hangs import BLOCKED_AFTER_S
from mfuscope.core.mfu import utilization
from msgspec import Struct

__all__ = [
    "AGENT_CATEGORIES",
    "CATEGORIES",
    "PHASES",
    "Booked",
    "LedgerTotals",
    "PhaseSpan",
    "ProcessTime",
    "book_batch",
    "effective_mfu",
    "phase_category",
    "rank_hang",
    "split_region",
    "wall_ns",
]

CATEGORIES: tuple[str, ...] = (
    "startup",
    "step",
    "redone_step",
    "checkpoint_save",
    "checkpoint_load",
    "evaluation",
    "other_phase",
    "hung",
    "down",
    "shutdown",
)
PHASES: tuple[str, ...] = ("checkpoint_save", "checkpoint_load", "evaluation", "other_phase")
# What an agent accounts for itself, in the order of `LedgerTotals`' fields.
AGENT_CATEGORIES: tuple[str, ...] = ("startup", *PHASES, "shutdown")

_BLOCKED_AFTER_NS = round(BLOCKED_AFTER_S * 1e9)

# (start, end, category) of one phase, in nanoseconds of one clock.
PhaseSpan = tuple[int, int, str]
# (category, nanoseconds) booked by one call, in the order booked; categories with 0 left out.
Booked = tuple[tuple[str, int], ...]


def phase_category(name: str) -> str:
    """The category of a phase named `name`: the name itself when it is one of `PHASES`, else
    ``other_phase`` (user names are never labels)."""
    return name if name in PHASES else "other_phase"


def wall_ns(wall_s: float) -> int:
    """A step's period in integer nanoseconds. The agent computes ``wall_s`` as nanoseconds /
    1e9; rounding gives them back exactly (a double holds 15-16 digits: a day in ns is 14)."""
    return round(wall_s * 1e9)


def split_region(start_ns: int, end_ns: int, phases: Sequence[PhaseSpan]) -> tuple[int, Booked]:
    """Split the region ``[start_ns, end_ns)`` of a rank's time (a step's period, startup or
    shutdown) between the phases in it and its owner.

    `phases` sorted by start. Each counts only inside the region and after the end of the phase
    before it (overlapping phases: the earlier one keeps the overlap). Returns the owner's
    nanoseconds (the rest of the region) and the phases' per category, which add up to the
    region's length exactly.
    """
    cursor = start_ns
    booked: dict[str, int] = {}
    for phase_start, phase_end, category in phases:
        low, high = max(phase_start, cursor), min(phase_end, end_ns)
        if high > low:
            booked[category] = booked.get(category, 0) + high - low
            cursor = high
    rest = max(end_ns - start_ns, 0) - sum(booked.values())
    return rest, tuple(booked.items())


class LedgerTotals(Struct, frozen=True, kw_only=True, gc=False):
    """What a rank's agent accounted for its own process (wire field ``ledger``, since 1.4):
    its start on the wall clock and, cumulative since then, the nanoseconds of each of
    `AGENT_CATEGORIES`. Never decreasing within one process: a lost batch loses nothing, a
    re-sent one adds nothing."""

    process_start_unix_ns: UnixNanos
    startup_ns: Count = 0
    checkpoint_save_ns: Count = 0
    checkpoint_load_ns: Count = 0
    evaluation_ns: Count = 0
    other_phase_ns: Count = 0
    shutdown_ns: Count = 0

    def totals_ns(self) -> tuple[int, ...]:
        """The totals in the order of `AGENT_CATEGORIES`."""
        return (
            self.startup_ns,
            self.checkpoint_save_ns,
            self.checkpoint_load_ns,
            self.evaluation_ns,
            self.other_phase_ns,
            self.shutdown_ns,
        )


@dataclass(frozen=True)
class ProcessTime:
    """What the ledger has booked for one rank's latest process: its `launch` (the job's
    incarnation number, in order of first arrival) and start; the agent's totals taken so far;
    every nanosecond booked to it (`booked_ns`: it accounts for ``[start, start + booked)``);
    the hung nanoseconds not yet taken out of the category they fell in (`debt_ns`); the hang
    being counted (group, seq) and how much of it is booked."""

    launch: int
    start_unix_ns: int
    agent_ns: tuple[int, ...] = (0,) * len(AGENT_CATEGORIES)
    booked_ns: int = 0
    debt_ns: int = 0
    hang: tuple[str, int] | None = None
    hang_ns: int = 0

    @property
    def end_unix_ns(self) -> int:
        """Where the time this process accounted for ends (its last sign of life, as booked)."""
        return self.start_unix_ns + self.booked_ns


def _pay(p: ProcessTime, category: str, ns: int) -> tuple[ProcessTime, Booked]:
    """Book `ns` of `category`, the hung debt first taken out of it."""
    paid = min(p.debt_ns, ns)
    rest = ns - paid
    p = dataclasses.replace(p, debt_ns=p.debt_ns - paid, booked_ns=p.booked_ns + rest)
    return p, ((category, rest),) if rest > 0 else ()


def rank_hang(groups: Sequence[GroupProgress]) -> tuple[tuple[str, int], int] | None:
    """The collective a rank is hung in by the hang rule, as ((group, seq), hung ns): its
    longest wait, once that is `BLOCKED_AFTER_S` or more (hung from that moment on); None while
    it waits in none that long."""
    longest = max(
        (g for g in groups if g.pending is not None),
        key=lambda g: g.pending.waited_s if g.pending is not None else 0.0,
        default=None,
    )
    if longest is None or longest.pending is None:
        return None
    hung = round(longest.pending.waited_s * 1e9) - _BLOCKED_AFTER_NS
    return ((longest.group, longest.pending.seq), hung) if hung >= 0 else None


def book_batch(
    previous: ProcessTime | None,
    launch: int,
    ledger: LedgerTotals | None,
    steps: Sequence[tuple[int, bool]] = (),
    groups: Sequence[GroupProgress] | None = None,
) -> tuple[ProcessTime | None, Booked]:
    """Book one batch of a rank: `launch` (its incarnation's number), its agent's `ledger` (None:
        an agent before schema 1.4, nothing is booked), its new step reports as (wall ns, redone),
        its collective progress `groups` (None: the batch carries none, the hang being counted stays
    as it was). Returns the rank's process time after the batch and what
        was booked, in order.

        A batch of an earlier launch than `previous` (a late re-send of a replaced process) books
        nothing: ``down`` already counted that time. A later launch starts a new process and books
        ``down``, from the end of the old one's time to the new one's start (0 if they overlap).
        The steps and totals are booked before the hang, so a batch's older steps never pay for a
        hang it reports.
    """
    if ledger is None:
        return previous, ()
    out: list[tuple[str, int]] = []
    p = previous
    if p is None or launch > p.launch:
        start = ledger.process_start_unix_ns
        if p is not None:
            down = start - p.end_unix_ns
            if down > 0:
                out.append(("down", down))
        p = ProcessTime(launch, start)
    elif launch < p.launch:
        return previous, ()
    for ns, redone in steps:
        p, booked = _pay(p, "redone_step" if redone else "step", ns)
        out += booked
    totals = ledger.totals_ns()
    for category, old, new in zip(AGENT_CATEGORIES, p.agent_ns, totals, strict=True):
        if new > old:
            p, booked = _pay(p, category, new - old)
            out += booked
    p = dataclasses.replace(p, agent_ns=tuple(map(max, p.agent_ns, totals)))
    if groups is None:
        return p, tuple(out)
    hang = rank_hang(groups)
    if hang is None:
        p = dataclasses.replace(p, hang=None, hang_ns=0)
    else:
        key, hung = hang
        counted = p.hang_ns if key == p.hang else 0
        grown = max(hung - counted, 0)
        p = dataclasses.replace(
            p,
            hang=key,
            hang_ns=counted + grown,
            debt_ns=p.debt_ns + grown,
            booked_ns=p.booked_ns + grown,
        )
        if grown:
            out.append(("hung", grown))
    return p, tuple(out)


def effective_mfu(useful_model_flops: float, peak_flop_rank_seconds: float) -> float | None:
    """Effective MFU: the model FLOPs of the steps that advanced training (redone steps left
    out) over the FLOPs the devices could have done in every rank-second of the job, startup
    and down included: ``useful / sum(peak_i x rank_seconds_i)``. None without a known peak."""
    return utilization(useful_model_flops, peak_flop_rank_seconds)
