"""Collectives per ``(op, axis, tier)`` over a run's measured steps: calls, bytes and busbw (pure).

What `mfuscope compare` sets side by side for each collective. Bandwidth is the one aggregation
of `core.bandwidth.aggregate_busbw_bytes_per_s` (docs/definitions.md#aggregating-busbw): summed
bus bytes over summed seconds of the calls whose size and group size are known.
"""

from __future__ import annotations

from dataclasses import dataclass

from mfuscope.core.bandwidth import aggregate_busbw_bytes_per_s, bus_factor
from mfuscope.core.run_summary.coverage import is_measured
from mfuscope.core.run_summary.run_data import RunData

__all__ = ["CollectiveTotal", "collective_totals"]


@dataclass(frozen=True)
class CollectiveTotal:
    """One ``(op, axis, tier)`` over a run's measured steps: `calls`, nccl-tests `bytes` (calls of
    known size), busbw (`core.bandwidth.aggregate_busbw_bytes_per_s` over the calls of known size
    and group size; None when they took no time), over `rank_steps` measured rank-steps."""

    op: str
    axis: str
    tier: str
    calls: int
    bytes: int
    seconds: float
    busbw_bytes_per_s: float | None
    rank_steps: int


def collective_totals(run: RunData) -> tuple[CollectiveTotal, ...]:
    """Collectives per ``(op, axis, tier)`` summed over every rank's measured steps (the steps of
    profiled windows, where collectives are observed), sorted by key."""
    measured = [s for r in run.ranks for s in r.steps if is_measured(s)]
    sums: dict[tuple[str, str, str], list[float]] = {}
    for step in measured:
        for c in step.collectives:
            acc = sums.setdefault((c.op, c.axis, c.tier), [0, 0, 0.0, 0.0, 0.0])
            acc[0] += c.count
            acc[2] += c.seconds
            if c.bytes is not None:
                acc[1] += c.bytes * c.count
                if c.group_size is not None:
                    acc[3] += c.bytes * c.count * bus_factor(c.op, c.group_size)
                    acc[4] += c.seconds
    return tuple(
        CollectiveTotal(
            op,
            axis,
            tier,
            int(acc[0]),
            int(acc[1]),
            acc[2],
            aggregate_busbw_bytes_per_s(acc[3], acc[4]),
            len(measured),
        )
        for (op, axis, tier), acc in sorted(sums.items())
    )
