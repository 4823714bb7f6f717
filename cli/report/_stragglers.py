"""Which ranks hold the job back (pure).

In a synchronous job every rank's step *wall* time is nearly the same: the fast ranks wait for the
slow one inside a collective or a pipeline receive. The slow rank shows instead in its *busy* time,
``compute + recompute + other`` (the time its device actually worked), while the ranks waiting for
it show more exposed communication and bubble. So the view gives both, as ratios to the job median:

- ``step_ratio``: the rank's median step wall time / the median over ranks of that median (the
  collector's `mfuscope_straggler_ratio` uses the same ratio on recent steps);
- ``busy_ratio``: the same for busy time, from steps that carry components.

`relative_step_time[rank][step]` is each step's wall time over that step's median across ranks,
for a heat map.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from mfuscope.cli.report._data import RunData
from mfuscope.core.schema import StepReport

__all__ = ["BUSY_COMPONENTS", "RankPace", "StragglerView", "busy_seconds", "straggler_view"]

BUSY_COMPONENTS = ("compute", "recompute", "other")


def busy_seconds(step: StepReport) -> float | None:
    """Seconds of the step the rank's device was working; None without components."""
    if not step.components:
        return None
    return sum(c.seconds for c in step.components if c.component in BUSY_COMPONENTS)


@dataclass(frozen=True)
class RankPace:
    rank: int
    median_step_s: float
    step_ratio: float
    median_busy_s: float | None
    busy_ratio: float | None


@dataclass(frozen=True)
class StragglerView:
    ranks: tuple[RankPace, ...]
    steps: tuple[int, ...]
    relative_step_time: tuple[tuple[float | None, ...], ...]  # [rank index][step index]

    @property
    def slowest(self) -> RankPace | None:
        """The rank with the highest busy ratio (step ratio when busy time is unknown)."""
        if not self.ranks:
            return None
        return max(self.ranks, key=lambda r: (r.busy_ratio or 0.0, r.step_ratio))


def _ratio(value: float, median: float) -> float:
    return value / median if median > 0 else 1.0


def straggler_view(run: RunData) -> StragglerView:
    """Per-rank pace against the job median and the per-step relative wall-time matrix."""
    ranks = [r for r in run.ranks if r.steps]
    medians = {r.rank: statistics.median(s.wall_s for s in r.steps) for r in ranks}
    busy: dict[int, float | None] = {}
    for r in ranks:
        values = [b for b in (busy_seconds(s) for s in r.steps) if b is not None]
        busy[r.rank] = statistics.median(values) if values else None
    job_median = statistics.median(medians.values()) if medians else 0.0
    known_busy = [b for b in busy.values() if b is not None]
    job_busy = statistics.median(known_busy) if known_busy else 0.0
    paces = tuple(
        RankPace(
            rank=r.rank,
            median_step_s=medians[r.rank],
            step_ratio=_ratio(medians[r.rank], job_median),
            median_busy_s=busy[r.rank],
            busy_ratio=None if busy[r.rank] is None else _ratio(busy[r.rank] or 0.0, job_busy),
        )
        for r in ranks
    )
    walls = {r.rank: {s.step: s.wall_s for s in r.steps} for r in ranks}
    steps = tuple(sorted({s for w in walls.values() for s in w}))
    step_median = {n: statistics.median(w[n] for w in walls.values() if n in w) for n in steps}
    matrix = tuple(
        tuple(
            _ratio(walls[r.rank][n], step_median[n]) if n in walls[r.rank] else None for n in steps
        )
        for r in ranks
    )
    return StragglerView(paces, steps, matrix)
