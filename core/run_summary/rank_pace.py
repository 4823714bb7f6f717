"""Which ranks hold the job back (pure).

In a synchronous job every rank's step *wall* time is nearly the same: the fast ranks wait for the
slow one inside a collective or a pipeline receive. The slow rank shows instead in its *own* time,
``wall - exposed_comm - bubble_pipeline`` (`core.stragglers.own_time_s`: the time it did not wait
on its peers, a slow data loader's `bubble_idle` included), while the ranks waiting for it show
more exposed communication and bubble.

Each rank's *straggler ratio* is the one value `core.stragglers` defines: its median step time
over its last `window_steps` step reports (own time when every rank has it, else wall time) over
the median across ranks, the same reports and the same functions the collector's
`mfuscope_straggler_ratio` uses, so the report, the demo and the alert give the same number. A
rank is *named* a straggler only above `STRAGGLER_MIN_RATIO` (the alert's threshold). The
whole-run medians of wall and own time are given beside it, in seconds;
`relative_step_time[rank][step]` is each step's wall time over that step's median across ranks,
for a heat map.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from mfuscope.core.run_summary.run_data import RankRun, RunData
from mfuscope.core.schema import StepReport
from mfuscope.core.stragglers import (
    DEFAULT_WINDOW_STEPS,
    StepTimeBasis,
    Straggler,
    find_stragglers,
    is_straggler,
    own_time_s,
    ratio_to_median,
    recent_step_times,
    straggler_step_times,
)

__all__ = ["RankPace", "StragglerView", "straggler_view"]


@dataclass(frozen=True)
class RankPace:
    """One rank: whole-run medians (s), and its straggler time (s, on the view's basis, over its
    `recent_steps` latest reports) and ratio."""

    rank: int
    median_step_s: float
    median_own_s: float | None
    recent_steps: int
    straggler_step_s: float
    ratio: float


@dataclass(frozen=True)
class StragglerView:
    ranks: tuple[RankPace, ...]
    steps: tuple[int, ...]
    relative_step_time: tuple[tuple[float | None, ...], ...]  # [rank index][step index]
    stragglers: tuple[Straggler, ...] = ()  # slowest first, at or above the median
    basis: StepTimeBasis = "wall"

    @property
    def named(self) -> tuple[Straggler, ...]:
        """The ranks named stragglers: ratio above `STRAGGLER_MIN_RATIO`, slowest first."""
        return tuple(s for s in self.stragglers if is_straggler(s.ratio))

    @property
    def slowest(self) -> Straggler | None:
        """The slowest rank at or above the median, named a straggler or not; None with fewer
        than two ranks or nothing to compare."""
        return self.stragglers[0] if self.stragglers else None


def _recent_reports(rank: RankRun) -> tuple[StepReport, ...]:
    """The reports a rank's straggler time is measured over (its latest, as sent)."""
    return rank.recent or rank.steps[-DEFAULT_WINDOW_STEPS:]


def straggler_view(run: RunData) -> StragglerView:
    """Per-rank pace, the stragglers by the collector's definition, and the per-step relative
    wall-time matrix."""
    ranks = [r for r in run.ranks if r.steps]
    recent = {
        r.rank: recent_step_times((s.wall_s, own_time_s(s)) for s in _recent_reports(r))
        for r in ranks
    }
    walls = {rank: wall for rank, (wall, _) in recent.items() if wall is not None}
    times, basis = straggler_step_times(walls, {rank: own for rank, (_, own) in recent.items()})
    job_median = statistics.median(times.values()) if times else 0.0
    paces = []
    for r in ranks:
        owns = [v for v in (own_time_s(s) for s in r.steps) if v is not None]
        paces.append(
            RankPace(
                rank=r.rank,
                median_step_s=statistics.median(s.wall_s for s in r.steps),
                median_own_s=statistics.median(owns) if owns else None,
                recent_steps=len(_recent_reports(r)),
                straggler_step_s=times[r.rank],
                ratio=ratio_to_median(times[r.rank], job_median),
            )
        )
    step_walls = {r.rank: {s.step: s.wall_s for s in r.steps} for r in ranks}
    steps = tuple(sorted({s for w in step_walls.values() for s in w}))
    step_median = {n: statistics.median(w[n] for w in step_walls.values() if n in w) for n in steps}
    matrix = tuple(
        tuple(
            ratio_to_median(step_walls[r.rank][n], step_median[n])
            if n in step_walls[r.rank]
            else None
            for n in steps
        )
        for r in ranks
    )
    return StragglerView(tuple(paces), steps, matrix, find_stragglers(times, top=len(times)), basis)
