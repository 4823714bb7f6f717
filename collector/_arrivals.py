"""Joining the ranks' arrival samples of one job into arrival skew and lateness.

Each rank sends, per group and step, the sequence number and enqueue time of the first collective
it completed (`ArrivalSample`). Samples wait here, keyed by ``(group, seq)``, until every rank of
the group has sent its own; then `core.arrivals.arrival_spread` gives the collective's skew and
each rank's lateness, folded into smoothed values per ``(axis, tier)`` and per rank. A group whose
ranks report to other collectors too (per-node sidecars with a group across nodes) never
completes here: no skew for it. Bounded: at most `max_pending` collectives wait (the oldest go).
"""

from __future__ import annotations

from collections import OrderedDict

from mfuscope.core.arrivals import arrival_spread, smoothed
from mfuscope.core.collective_records import ArrivalSample, GroupProgress

__all__ = ["ArrivalJoin"]


class ArrivalJoin:
    __slots__ = ("_groups", "_max", "_pending", "lateness", "skew")

    def __init__(self, max_pending: int = 256) -> None:
        self._max = max_pending
        self._groups: dict[str, tuple[str, str, int]] = {}  # group -> axis, tier, size
        self._pending: OrderedDict[tuple[str, int], dict[int, int]] = OrderedDict()
        self.skew: dict[tuple[str, str], float] = {}  # (axis, tier) -> smoothed skew, s
        self.lateness: dict[int, float] = {}  # rank -> smoothed lateness, s

    def add(
        self, rank: int, samples: tuple[ArrivalSample, ...], groups: tuple[GroupProgress, ...]
    ) -> None:
        for g in groups:
            if g.size is not None and g.size > 1:
                self._groups[g.group] = (g.axis, g.tier, g.size)
        for sample in samples:
            info = self._groups.get(sample.group)
            if info is None:
                continue
            key = (sample.group, sample.seq)
            times = self._pending.get(key)
            if times is None:
                times = self._pending[key] = {}
                while len(self._pending) > self._max:
                    self._pending.popitem(last=False)
            times[rank] = sample.enqueued_unix_ns
            if len(times) >= info[2]:
                del self._pending[key]
                self._fold(info[0], info[1], times)

    def _fold(self, axis: str, tier: str, times: dict[int, int]) -> None:
        skew, lateness = arrival_spread(times)
        self.skew[(axis, tier)] = smoothed(self.skew.get((axis, tier)), skew)
        for rank, late in lateness.items():
            self.lateness[rank] = smoothed(self.lateness.get(rank), late)

    def forget(self, rank: int) -> None:
        """An expired rank: its lateness goes (its samples age out with their collectives)."""
        self.lateness.pop(rank, None)
