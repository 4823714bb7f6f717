"""What a run's step breakdowns are of: measured in profiled windows, or carried (pure).

A step's buckets are measured only on the steps of a profiled window (the agent profiles a few
steps now and then); every later step carries its latest window's breakdown, scaled to its own
wall time, until the next window (docs/agent.md, "Profiled windows"). A report's `breakdown_step`
says which: the step itself for a measured step, an earlier one for a carried step. A carried
breakdown is as old as the steps (and seconds) since its window. Nothing about the step's own
buckets was measured on a carried step, so averages of buckets are taken over measured steps,
and counts of both are shown wherever a breakdown is.

A *window* here is a run of consecutive measured steps of one rank; ranks profile the same
steps, so the job's windows are the most any rank has.

How far a carried figure can be off: the spread between windows (`window_spread`).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from mfuscope.core.run_summary.run_data import RunData
from mfuscope.core.run_summary.window_spread import (
    SPREAD_WINDOWS,
    exposed_parts,
    exposed_spread,
    window_exposed_share,
)
from mfuscope.core.schema import StepReport

__all__ = ["Coverage", "RankCoverage", "coverage", "is_measured", "rank_coverage"]


def is_measured(step: StepReport) -> bool:
    """Whether `step`'s breakdown was measured on the step itself (in a profiled window)."""
    return bool(step.components) and step.breakdown_step == step.step


@dataclass(frozen=True)
class RankCoverage:
    """One rank's steps by where their breakdown comes from; ages of carried breakdowns in steps
    (``step - breakdown_step``) and seconds (between the two steps' starts; None when the
    breakdown's own step is not in the input)."""

    rank: int
    windows: int
    measured: int
    carried: int
    without: int  # steps with no breakdown yet (before the first window)
    latest_window_step: int | None  # the newest measured step
    oldest_carried_steps: int | None
    oldest_carried_s: float | None
    window_ranges: tuple[tuple[int, int], ...] = ()  # (first, last) measured step of each window
    exposed_spread: float | None = None  # the spread between its latest windows (0..1)


@dataclass(frozen=True)
class Coverage:
    """The job's coverage: per rank, and totals over ranks (rank-steps)."""

    ranks: tuple[RankCoverage, ...]

    @property
    def windows(self) -> int:
        return max((r.windows for r in self.ranks), default=0)

    @property
    def window_ranges(self) -> tuple[tuple[int, int], ...]:
        """(first, last) step of every window any rank measured, sorted."""
        return tuple(sorted({w for r in self.ranks for w in r.window_ranges}))

    @property
    def measured(self) -> int:
        return sum(r.measured for r in self.ranks)

    @property
    def carried(self) -> int:
        return sum(r.carried for r in self.ranks)

    @property
    def without(self) -> int:
        return sum(r.without for r in self.ranks)

    @property
    def oldest_carried_steps(self) -> int | None:
        return max(
            (r.oldest_carried_steps for r in self.ranks if r.oldest_carried_steps is not None),
            default=None,
        )

    @property
    def oldest_carried_s(self) -> float | None:
        return max(
            (r.oldest_carried_s for r in self.ranks if r.oldest_carried_s is not None), default=None
        )

    @property
    def exposed_spread(self) -> float | None:
        """The largest spread between windows of any rank (0..1); None before two windows."""
        return max(
            (r.exposed_spread for r in self.ranks if r.exposed_spread is not None), default=None
        )

    def describe(self) -> str:
        """One line for people: "4 windows measured 12 steps per rank (24 rank-steps); 1070
        rank-steps carry an earlier window's breakdown (up to 480 steps, 35 s old)"."""
        per_rank = sorted({r.measured for r in self.ranks})
        each = (
            f"{per_rank[0]} steps per rank, " if len(per_rank) == 1 and len(self.ranks) > 1 else ""
        )
        text = (
            f"{self.windows} profiled window{'s' * (self.windows != 1)} measured "
            f"{each}{self.measured} rank-step{'s' * (self.measured != 1)}"
        )
        if self.carried:
            age = _age(self.oldest_carried_steps, self.oldest_carried_s)
            text += f"; {self.carried} rank-steps carry an earlier window's breakdown{age}"
        if self.without:
            text += f"; {self.without} rank-steps have none (before the first window)"
        spread = self.exposed_spread
        if spread is not None:
            text += (
                f"; exposed comm differed by up to {100 * spread:.1f} points between a rank's "
                f"latest {SPREAD_WINDOWS} windows (how far a carried figure can be off)"
            )
        return text


def _age(steps: int | None, seconds: float | None) -> str:
    if steps is None:
        return ""
    return (
        f" (up to {steps} steps" + (f", {seconds:.0f} s" if seconds is not None else "") + " old)"
    )


def _runs(numbers: Iterable[int]) -> tuple[tuple[int, int], ...]:
    """The runs of consecutive integers in `numbers` (sorted, distinct), as (first, last)."""
    runs: list[list[int]] = []
    for n in numbers:
        if runs and n == runs[-1][1] + 1:
            runs[-1][1] = n
        else:
            runs.append([n, n])
    return tuple((first, last) for first, last in runs)


def rank_coverage(rank: int, steps: Sequence[StepReport]) -> RankCoverage:
    """`steps` (one rank's, any order) by where their breakdown comes from."""
    measured = sorted({s.step for s in steps if is_measured(s)})
    start_of = {s.step: s.start_unix_ns for s in steps if is_measured(s)}
    carried = [s for s in steps if s.components and not is_measured(s)]
    ages = [s.step - s.breakdown_step for s in carried if s.breakdown_step is not None]
    seconds = [
        (s.start_unix_ns - start_of[s.breakdown_step]) / 1e9
        for s in carried
        if s.breakdown_step in start_of
    ]
    windows = _runs(measured)
    by_step = {s.step: s for s in steps if is_measured(s)}
    shares = [
        window_exposed_share([exposed_parts(by_step[n]) for n in range(first, last + 1)])
        for first, last in windows
    ]
    return RankCoverage(
        rank=rank,
        windows=len(windows),
        measured=sum(1 for s in steps if is_measured(s)),
        carried=len(carried),
        without=sum(1 for s in steps if not s.components),
        latest_window_step=measured[-1] if measured else None,
        oldest_carried_steps=max(ages) if ages else None,
        oldest_carried_s=max(seconds) if seconds else None,
        window_ranges=windows,
        exposed_spread=exposed_spread([s for s in shares if s is not None]),
    )


def coverage(run: RunData) -> Coverage:
    """Every rank's coverage in `run`."""
    return Coverage(tuple(rank_coverage(r.rank, r.steps) for r in run.ranks))
