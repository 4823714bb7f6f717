"""Which ranks hold the job back (pure).

In a synchronous job every rank's step *wall* time is nearly the same: the fast ranks wait for the
slow one inside a collective or a pipeline receive. The slow rank shows instead in its *own* time,
``wall - exposed_comm - bubble_pipeline`` (`core.stragglers.own_time_s`: the time it did not wait
on its peers, a slow data loader's `bubble_idle` included), while the ranks waiting for it show
more exposed communication and bubble. So the view gives both, as ratios to the job median:

- ``step_ratio``: the rank's median step wall time / the median over ranks of that median;
- ``own_ratio``: the same for own time, from steps that carry components.

`stragglers` are named by `core.stragglers.find_stragglers` on the same step times the
collector's `mfuscope_straggler_ratio` uses (own time when every rank has it, else wall time), so
the report and the alert name the same rank. `relative_step_time[rank][step]` is each step's wall
time over that step's median across ranks, for a heat map.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from mfuscope.core.aggregate.run import RunData
from mfuscope.core.stragglers import (
    StepTimeBasis,
    Straggler,
    find_stragglers,
    own_time_s,
    ratio_to_median,
    straggler_step_times,
)

__all__ = ["RankPace", "StragglerView", "straggler_view"]


@dataclass(frozen=True)
class RankPace:
    rank: int
    median_step_s: float
    step_ratio: float
    median_own_s: float | None
    own_ratio: float | None


@dataclass(frozen=True)
class StragglerView:
    ranks: tuple[RankPace, ...]
    steps: tuple[int, ...]
    relative_step_time: tuple[tuple[float | None, ...], ...]  # [rank index][step index]
    stragglers: tuple[Straggler, ...] = ()  # slowest first, at or above the median
    basis: StepTimeBasis = "wall"

    @property
    def slowest(self) -> RankPace | None:
        """The rank the collector would name first as a straggler; None when no rank is at or
        above the median (fewer than two ranks, or nothing to compare)."""
        if not self.stragglers:
            return None
        first = self.stragglers[0].rank
        return next(p for p in self.ranks if p.rank == first)


def straggler_view(run: RunData) -> StragglerView:
    """Per-rank pace against the job median, the stragglers, and the per-step relative wall-time
    matrix."""
    ranks = [r for r in run.ranks if r.steps]
    medians = {r.rank: statistics.median(s.wall_s for s in r.steps) for r in ranks}
    own: dict[int, float | None] = {}
    for r in ranks:
        values = [v for v in (own_time_s(s) for s in r.steps) if v is not None]
        own[r.rank] = statistics.median(values) if values else None
    job_median = statistics.median(medians.values()) if medians else 0.0
    known_own = [v for v in own.values() if v is not None]
    job_own = statistics.median(known_own) if known_own else 0.0
    paces = tuple(
        RankPace(
            rank=r.rank,
            median_step_s=medians[r.rank],
            step_ratio=ratio_to_median(medians[r.rank], job_median),
            median_own_s=own[r.rank],
            own_ratio=None if own[r.rank] is None else ratio_to_median(own[r.rank] or 0.0, job_own),
        )
        for r in ranks
    )
    times, basis = straggler_step_times(medians, own)
    walls = {r.rank: {s.step: s.wall_s for s in r.steps} for r in ranks}
    steps = tuple(sorted({s for w in walls.values() for s in w}))
    step_median = {n: statistics.median(w[n] for w in walls.values() if n in w) for n in steps}
    matrix = tuple(
        tuple(
            ratio_to_median(walls[r.rank][n], step_median[n]) if n in walls[r.rank] else None
            for n in steps
        )
        for r in ranks
    )
    return StragglerView(paces, steps, matrix, find_stragglers(times, top=len(times)), basis)
