"""Stragglers: each rank's own time per step against the median over the job's ranks
(see docs/definitions.md). The collector's alert and the report both call these functions, so
they name the same slow rank.

Which step time: in a synchronous job every rank's *wall* time per step is the same (the fast ranks
wait for the slow one inside a collective), so wall time alone cannot show a straggler. The time a
rank spends *not waiting for its peers* can: its **own time**,
``own_s = wall_s - exposed_comm - bubble_pipeline`` (docs/definitions.md#own-time: exposed
communication and the pipeline bubble are where a rank waits on others). A rank with a slow GPU
has more compute; a rank with a slow data loader has more ``bubble_idle`` (its device idles while
its own input is late, and the whole job waits for it); either way its own time exceeds the median
while its peers' waiting grows instead. Counting only ``compute + recompute + other`` would miss
the slow data loader.

When a rank has no breakdown yet (no profiled window), the job falls back to wall time for all
its ranks: own times of some ranks against wall times of others would not compare.

One value everywhere: a rank's straggler ratio is the median of its step time over its last
`DEFAULT_WINDOW_STEPS` step reports (in the order its agent sent them, as the collector receives
them), over the median of the same across the job's ranks (`recent_step_times`, then
`straggler_step_times` and `find_stragglers`). The collector's `mfuscope_straggler_ratio`, the
demo and the report all compute it so. A rank is *named* a straggler only when its ratio is
above `STRAGGLER_MIN_RATIO`, the threshold of the `MFUScopeStragglerRank` alert; below it, it is
only the slowest rank.

Pure functions over plain data.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Literal

from mfuscope.core.schema import StepReport
from mfuscope.core.vocabulary import WAITING_COMPONENTS

__all__ = [
    "DEFAULT_WINDOW_STEPS",
    "STRAGGLER_MIN_RATIO",
    "StepTimeBasis",
    "Straggler",
    "find_stragglers",
    "is_straggler",
    "own_time_s",
    "ratio_to_median",
    "recent_step_times",
    "straggler_step_times",
]

# Step reports per rank behind the straggler ratio (the collector's --window-steps default).
DEFAULT_WINDOW_STEPS = 20
# A rank is named a straggler above this ratio: the threshold of the MFUScopeStragglerRank alert
# (deploy/prometheus/rules/mfuscope-alerts.yml), so the report, the demo and the page agree.
STRAGGLER_MIN_RATIO = 1.20

# "self": own time (wall - waiting on peers); "wall": wall time, when some rank has no breakdown.
StepTimeBasis = Literal["self", "wall"]


@dataclass(frozen=True)
class Straggler:
    """A rank whose recent step time is `ratio` times the median over the job's ranks."""

    rank: int
    step_s: float
    ratio: float


def own_time_s(step: StepReport) -> float | None:
    """Seconds of `step` this rank spent not waiting on its peers:
    ``wall_s - exposed_comm - bubble_pipeline`` (never below 0); None when the step carries no
    breakdown (components)."""
    if not step.components:
        return None
    waiting = math.fsum(c.seconds for c in step.components if c.component in WAITING_COMPONENTS)
    return max(step.wall_s - waiting, 0.0)


def recent_step_times(
    recent: Iterable[tuple[float, float | None]],
) -> tuple[float | None, float | None]:
    """(median wall time, median own time) in seconds over a rank's recent steps, given as
    ``(wall_s, own_s or None)`` pairs; the own median is None unless every step has one, and
    both are None without steps."""
    pairs = list(recent)
    if not pairs:
        return None, None
    owns = [own for _, own in pairs if own is not None]
    median_own = _median(owns) if len(owns) == len(pairs) else None
    return _median([wall for wall, _ in pairs]), median_own


def _median(values: list[float]) -> float:
    # statistics.median without its type dispatch: the collector calls this once per batch of
    # every rank (thousands per second at scale).
    ordered = sorted(values)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2


def is_straggler(ratio: float) -> bool:
    """Whether a straggler ratio names its rank a straggler (above `STRAGGLER_MIN_RATIO`)."""
    return ratio > STRAGGLER_MIN_RATIO


def ratio_to_median(value: float, median: float) -> float:
    """``value / median``; 1.0 when the median is not positive (nothing to compare against)."""
    return value / median if median > 0 else 1.0


def straggler_step_times(
    wall_s_by_rank: Mapping[int, float], own_s_by_rank: Mapping[int, float | None]
) -> tuple[dict[int, float], StepTimeBasis]:
    """The per-rank step times stragglers are judged on: own time when every rank in
    `wall_s_by_rank` has one, else wall time for all of them (seconds)."""
    own = {rank: own_s_by_rank.get(rank) for rank in wall_s_by_rank}
    if all(value is not None for value in own.values()):
        return {rank: value for rank, value in own.items() if value is not None}, "self"
    return dict(wall_s_by_rank), "wall"


def find_stragglers(step_s_by_rank: Mapping[int, float], *, top: int) -> tuple[Straggler, ...]:
    """The `top` ranks with the largest ``step_s / median(step_s over all ranks)``, slowest first
    (ties by rank), among those at or above the median (ratio >= 1): the faster half is never
    called a straggler. Empty with fewer than two ranks or a zero median (nothing to compare)."""
    if top < 0:
        raise ValueError(f"top must be >= 0, got {top}")
    if len(step_s_by_rank) < 2:
        return ()
    median = statistics.median(step_s_by_rank.values())
    if median <= 0:
        return ()
    ranked = sorted(
        ((rank, step_s) for rank, step_s in step_s_by_rank.items() if step_s >= median),
        key=lambda item: (-item[1], item[0]),
    )
    return tuple(
        Straggler(rank=rank, step_s=step_s, ratio=ratio_to_median(step_s, median))
        for rank, step_s in ranked[:top]
    )
