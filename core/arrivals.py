"""Arrival skew: who enters a collective late (pure; docs/definitions.md#arrival-skew).

Every rank of a group must enter a collective before any can finish it, so the spread of the
ranks' enqueue times of one collective is time the early ranks spend waiting for the late ones.
The flight recorder stamps each op with the host's wall clock when the rank enqueued it
(``time_created_ns``). For one collective that every rank of its group completed:

- its *skew* is the latest enqueue time minus the earliest, s;
- a rank's *lateness* is its enqueue time minus the median of the group's, s (negative: early).
  The median, not the earliest, so that one early rank does not make the rest look late.

Enqueue times on one host share one clock, so within a node these are exact. Across hosts each
host's clock offset adds to them: with NTP in one data centre the offset is typically well under
a millisecond to a few milliseconds (PTP: microseconds), so an inter-node skew or lateness is
meaningful only well above the hosts' offset (`chronyc tracking` shows it). On GPUs the enqueue is
the host's: a rank whose host runs ahead enqueues early even if its device is behind, so this
measures host-side lateness (data loading, Python overhead, a slow CPU), not kernel start times.

`smoothed` is the exponentially weighted mean the collector keeps of both (weight
`ARRIVAL_WEIGHT` per new collective).

**Across collectors** (docs/fleet.md#arrival-skew-across-sidecars): a group whose ranks report to
several collectors never completes in any of them, so each collector holds, per rank and such
group, one sample per period of `ARRIVAL_SAMPLE_S` seconds and exports it; the rules join the
ranks' held samples. `replaces_held` picks the sample: the first one enqueued in a period later
than the held one's. Every rank of a group sends samples of the same collectives (the first of
each step), so all of them hold the same collective, except when a period boundary falls between
two ranks' enqueue times of one collective (a chance of skew / step time per period): then the
rules see different sequence numbers and skip that period.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping

__all__ = ["ARRIVAL_SAMPLE_S", "ARRIVAL_WEIGHT", "arrival_spread", "replaces_held", "smoothed"]

ARRIVAL_WEIGHT = 0.1
# One held sample per rank and group per minute: with a 15 s scrape a period's samples are all
# in the store for most of the minute after them, so the rules see each period's skew.
ARRIVAL_SAMPLE_S = 60.0


def arrival_spread(enqueued_unix_ns: Mapping[int, int]) -> tuple[float, dict[int, float]]:
    """(skew, lateness per rank) of one collective from each rank's enqueue time (ns), in s."""
    if not enqueued_unix_ns:
        return 0.0, {}
    # Relative to the earliest: Unix nanoseconds are too large for a float's 53 bits.
    earliest = min(enqueued_unix_ns.values())
    offsets = {rank: t - earliest for rank, t in enqueued_unix_ns.items()}
    median = statistics.median(offsets.values())
    skew = max(offsets.values()) / 1e9
    return skew, {rank: (t - median) / 1e9 for rank, t in offsets.items()}


def smoothed(previous: float | None, value: float) -> float:
    """The exponentially weighted mean after `value` (the value itself when there is none)."""
    return value if previous is None else previous + ARRIVAL_WEIGHT * (value - previous)


def replaces_held(held_unix_ns: int | None, enqueued_unix_ns: int, period_s: float) -> bool:
    """Whether a sample enqueued at `enqueued_unix_ns` replaces the one held (enqueued at
    `held_unix_ns`; None: none): it does when it falls in a later period of `period_s` seconds
    (periods counted from the epoch, so every host cuts them at the same instants, to within
    its clock offset)."""
    if held_unix_ns is None:
        return True
    period_ns = max(int(period_s * 1e9), 1)
    return enqueued_unix_ns // period_ns > held_unix_ns // period_ns
