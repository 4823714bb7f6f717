"""Straggler detection: each rank's recent step time against the median over the job's ranks.

Which step time: in a synchronous job every rank's *wall* time per step is the same (the fast ranks
wait for the slow one inside a collective), so wall time alone cannot show a straggler. The time a
rank spends *not waiting for its peers* can: ``self_s = wall_s - exposed_comm - bubble_pipeline``
(docs/definitions.md#own-time: exposed communication and pipeline bubble are where a rank waits
on others).
A rank with a slow GPU has more compute; a rank with a slow data loader has more ``bubble_idle``;
either way its `self_s` exceeds the median while its peers' waiting grows instead. When a rank has
no breakdown yet (no profiled window), the job falls back to wall time for all its ranks.

Pure functions over plain data.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping
from dataclasses import dataclass

__all__ = ["WAITING_COMPONENTS", "Straggler", "find_stragglers"]


@dataclass(frozen=True)
class Straggler:
    """A rank whose recent step time is `ratio` times the median over the job's ranks."""

    rank: int
    step_s: float
    ratio: float


# The buckets in which a rank waits on its peers rather than doing its own work.
WAITING_COMPONENTS: frozenset[str] = frozenset({"exposed_comm", "bubble_pipeline"})


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
        Straggler(rank=rank, step_s=step_s, ratio=step_s / median) for rank, step_s in ranked[:top]
    )
