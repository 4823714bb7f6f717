"""Bus bandwidth per tier against message size, the tier's spec, and its alpha-beta fit (pure).

Each collective sample in a step report stands for `count` calls of one `(op, axis, tier,
group_size, bytes)` over a profiled window, `seconds` in total. The report merges equal keys over
ranks and steps into one point whose time per call is ``Σ seconds / Σ count``; bandwidth follows
nccl-tests (`mfuscope.core.bandwidth`): ``algbw = S / t``, ``busbw = algbw * factor``.

The per-tier fit is ``t = alpha + S·factor / beta`` (bus bytes, so beta is directly comparable
with busbw and with the link's unidirectional spec, and ops with different factors share one fit).
This treats alpha as one latency per tier; ring algorithms really pay it once per step of the ring,
so read alpha as the latency of a typical collective of the tier, not of one hop.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from mfuscope.core.bandwidth import bus_factor, busbw_bytes_per_s
from mfuscope.core.comm_fit import AlphaBetaFit, fit_alpha_beta
from mfuscope.core.run_summary.run_data import RunData
from mfuscope.core.vocabulary import TIERS

__all__ = ["BandwidthPoint", "TierBandwidth", "bandwidth_by_tier"]


@dataclass(frozen=True)
class BandwidthPoint:
    """One distinct collective, merged over ranks and steps."""

    op: str
    axis: str
    tier: str
    group_size: int
    size_bytes: int  # S as nccl-tests counts it
    calls: int
    seconds_per_call: float

    @property
    def bus_bytes(self) -> float:
        return self.size_bytes * bus_factor(self.op, self.group_size)

    @property
    def busbw_bytes_per_s(self) -> float:
        return busbw_bytes_per_s(self.op, self.group_size, self.size_bytes, self.seconds_per_call)


@dataclass(frozen=True)
class TierBandwidth:
    """Observed points of one tier, its spec (per axis, from the agents' topology), and the fit."""

    tier: str
    points: tuple[BandwidthPoint, ...]
    specs: tuple[tuple[str, float], ...]  # (axis, unidirectional link peak in bytes/s)
    fit: AlphaBetaFit | None

    @property
    def best_busbw_bytes_per_s(self) -> float:
        return max(p.busbw_bytes_per_s for p in self.points)


def bandwidth_by_tier(run: RunData) -> tuple[TierBandwidth, ...]:
    """Points, spec lines and alpha-beta fit per tier, in vocabulary tier order.

    Collectives of unknown size, unknown group size (the bus factor needs n) or zero duration
    carry no bandwidth and are left out.
    """
    calls: dict[tuple[str, str, str, int, int], list[tuple[int, float]]] = {}
    for rank in run.ranks:
        for step in rank.steps:
            for c in step.collectives:
                if c.bytes is None or c.group_size is None or c.seconds <= 0:
                    continue
                key = (c.tier, c.op, c.axis, c.group_size, c.bytes)
                calls.setdefault(key, []).append((c.count, c.seconds))
    points_by_tier: dict[str, list[BandwidthPoint]] = {}
    for (tier, op, axis, group_size, size), samples in sorted(calls.items()):
        count = sum(n for n, _ in samples)
        point = BandwidthPoint(
            op, axis, tier, group_size, size, count, math.fsum(s for _, s in samples) / count
        )
        points_by_tier.setdefault(tier, []).append(point)
    specs: dict[str, set[tuple[str, float]]] = {}
    for rank in run.ranks:
        for group in rank.topology.groups if rank.topology else ():
            if group.link_peak_bytes_per_s is not None:
                specs.setdefault(group.tier, set()).add((group.axis, group.link_peak_bytes_per_s))
    result = []
    for tier in sorted(points_by_tier, key=TIERS.index):
        points = tuple(points_by_tier[tier])
        fit = fit_alpha_beta(
            [p.bus_bytes for p in points],
            [p.seconds_per_call for p in points],
            [float(p.calls) for p in points],
        )
        result.append(TierBandwidth(tier, points, tuple(sorted(specs.get(tier, ()))), fit))
    return tuple(result)
