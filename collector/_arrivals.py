"""Joining the ranks' arrival samples of one job into arrival skew and lateness.

Each rank sends, per group and step, the sequence number and enqueue time of the first collective
it completed (`ArrivalSample`). Samples wait here, keyed by ``(group, seq)``, until every rank of
the group has sent its own; then `core.arrivals.arrival_spread` gives the collective's skew and
each rank's lateness, folded into smoothed values per ``(axis, tier)`` and per rank. A group whose
ranks report to other collectors too (per-node sidecars with a group across nodes) never
completes here: for such a group (fewer of its ranks report here than it has) each rank's held
sample (`core.arrivals.replaces_held`, one per period) is kept for export, and the rules join
them across collectors (docs/fleet.md#arrival-skew-across-sidecars). Bounded: at most
`max_pending` collectives wait (the oldest go); one held sample per rank and group.
"""

from __future__ import annotations

from collections import OrderedDict

from mfuscope.core.arrivals import ARRIVAL_SAMPLE_S, arrival_spread, replaces_held, smoothed
from mfuscope.core.collective_records import ArrivalSample, GroupProgress

__all__ = ["ArrivalJoin"]


class ArrivalJoin:
    __slots__ = (
        "_groups",
        "_held",
        "_max",
        "_members",
        "_pending",
        "_period_s",
        "lateness",
        "skew",
    )

    def __init__(self, max_pending: int = 256, sample_s: float = ARRIVAL_SAMPLE_S) -> None:
        self._max = max_pending
        self._period_s = sample_s
        self._groups: dict[str, tuple[str, str, int]] = {}  # group -> axis, tier, size
        self._members: dict[str, set[int]] = {}  # group -> the ranks here that are in it
        # (rank, group) -> (seq, enqueue time ns) of the held sample
        self._held: dict[tuple[int, str], tuple[int, int]] = {}
        self._pending: OrderedDict[tuple[str, int], dict[int, int]] = OrderedDict()
        self.skew: dict[tuple[str, str], float] = {}  # (axis, tier) -> smoothed skew, s
        self.lateness: dict[int, float] = {}  # rank -> smoothed lateness, s

    def add(
        self, rank: int, samples: tuple[ArrivalSample, ...], groups: tuple[GroupProgress, ...]
    ) -> None:
        for g in groups:
            if g.size is not None and g.size > 1:
                self._groups[g.group] = (g.axis, g.tier, g.size)
                self._members.setdefault(g.group, set()).add(rank)
        for sample in samples:
            info = self._groups.get(sample.group)
            if info is None:
                continue
            if self._spans(sample.group):
                held = self._held.get((rank, sample.group))
                if replaces_held(
                    None if held is None else held[1], sample.enqueued_unix_ns, self._period_s
                ):
                    self._held[(rank, sample.group)] = (sample.seq, sample.enqueued_unix_ns)
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

    def _spans(self, group: str) -> bool:
        """Whether some ranks of `group` report elsewhere (fewer than its size report here)."""
        return len(self._members.get(group, ())) < self._groups[group][2]

    def held(self) -> list[tuple[int, str, str, str, int, int]]:
        """(rank, group, axis, tier, seq, enqueue time ns) of each held sample of a group that
        spans collectors, by rank and group."""
        out = []
        for (rank, group), (seq, enqueued) in sorted(self._held.items()):
            if self._spans(group):
                axis, tier, _ = self._groups[group]
                out.append((rank, group, axis, tier, seq, enqueued))
        return out

    def spanning(self) -> list[tuple[str, str, str, int]]:
        """(group, axis, tier, size) of each group with held samples that spans collectors."""
        groups = sorted({group for _, group in self._held if self._spans(group)})
        return [(g, *self._groups[g]) for g in groups]

    def forget(self, rank: int) -> None:
        """An expired rank: its lateness and held samples go (its pending samples age out with
        their collectives)."""
        self.lateness.pop(rank, None)
        for members in self._members.values():
            members.discard(rank)
        for key in [k for k in self._held if k[0] == rank]:
            del self._held[key]
