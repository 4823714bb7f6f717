"""How far a carried breakdown can be off: the spread between windows (pure).

The *spread between windows* is the largest minus the smallest exposed-communication share of a
rank's last `SPREAD_WINDOWS` windows (each as the steps after it carry it,
`core.step_report.carried_breakdown`: its first step left out), in 0..1. A breakdown carried from
one window is one sample of a quantity that moves from step to step; the spread between samples is
what a reader can see of that (docs/definitions.md#carried-breakdowns). The report
(`coverage`) and the collector (`mfuscope_breakdown_spread_ratio`) both compute it here.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from mfuscope.core.schema import StepReport
from mfuscope.core.step_report import carried_steps

__all__ = ["SPREAD_WINDOWS", "exposed_parts", "exposed_spread", "window_exposed_share"]

# The windows the spread is taken over (a rank's latest).
SPREAD_WINDOWS = 5


def exposed_parts(step: StepReport) -> tuple[float, float]:
    """(exposed communication s, measured s) of a measured step: its buckets but the
    profiler's own `instrumentation`."""
    exposed = math.fsum(c.seconds for c in step.components if c.component == "exposed_comm")
    ours = math.fsum(c.seconds for c in step.components if c.component == "instrumentation")
    return exposed, max(step.wall_s - ours, 0.0)


def window_exposed_share(parts: Sequence[tuple[float, float]]) -> float | None:
    """The exposed-communication share a window's carried breakdown holds, from its steps'
    `exposed_parts` in step order (the first left out when there are several); None if empty."""
    kept = carried_steps(parts)
    measured = math.fsum(m for _, m in kept)
    return math.fsum(e for e, _ in kept) / measured if measured > 0 else None


def exposed_spread(shares: Sequence[float]) -> float | None:
    """The spread between windows (module docstring) of a rank's window shares, oldest first;
    None with fewer than two windows."""
    latest = shares[-SPREAD_WINDOWS:]
    return max(latest) - min(latest) if len(latest) > 1 else None
