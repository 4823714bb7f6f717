"""Agent-health counters of one job, kept monotonic across rank expiry and agent restarts.

Each agent reports cumulative counters for its own process (`AgentHealth`). Exported as the sum
over the job's *live* ranks, the job total would fall when a rank expires and when an agent
restarts (its counters start again from 0), and PromQL `rate`/`increase` read every fall as a
counter reset: a false `MFUScopeReportsDropped` alert and wrong rates.

So the ledger keeps, per rank seen while the job lives, the last cumulative values the agent sent
(`last`) and what earlier agent processes of that rank had counted (`offset`); the rank's
counters are ``offset + last``. A batch whose values are lower than `last` in any field comes from
a restarted process (counters of one process never decrease; the agent sends one batch at a time,
in order): `last` moves into `offset` and the new values count on top. An expired rank stays in
the ledger until its job expires, so the job total never falls and a rank that returns (same
process or a new one) continues from where it was. Memory: one small entry per rank ever seen
while the job lives (at most the world size). Integers, so the sums are exact.
"""

from __future__ import annotations

from collections.abc import Sequence

from mfuscope.core.schema import AgentHealth

__all__ = ["HEALTH_FIELDS", "HealthLedger", "health_counts"]

Counts = tuple[int, ...]
# The agent-health counters, in `AgentHealth` field order (the order of every `Counts`).
HEALTH_FIELDS: tuple[str, ...] = AgentHealth.__struct_fields__


def health_counts(health: AgentHealth) -> Counts:
    """`health` as a tuple in `HEALTH_FIELDS` order."""
    return tuple(getattr(health, name) for name in HEALTH_FIELDS)


class _RankEntry:
    __slots__ = ("last", "offset", "start_unix_ns")

    def __init__(self, width: int, start_unix_ns: int) -> None:
        self.offset: Counts = (0,) * width
        self.last: Counts = (0,) * width
        self.start_unix_ns = start_unix_ns


class HealthLedger:
    """Restart-adjusted cumulative counters per rank of one job, and their job total."""

    __slots__ = ("_entries", "_total", "_width")

    def __init__(self, width: int = len(HEALTH_FIELDS)) -> None:
        self._width = width
        self._entries: dict[int, _RankEntry] = {}
        self._total: list[int] = [0] * width

    def update(self, rank: int, values: Sequence[int], now_unix_ns: int) -> None:
        """Take `rank`'s latest cumulative `values` (its agent process's counts)."""
        if len(values) != self._width:
            raise ValueError(f"expected {self._width} counters, got {len(values)}")
        entry = self._entries.get(rank)
        if entry is None:
            entry = self._entries[rank] = _RankEntry(self._width, now_unix_ns)
        elif entry.last == tuple(values):
            return  # the usual case: nothing new since the rank's previous batch
        before = self.counts(rank)
        if any(new < last for new, last in zip(values, entry.last, strict=True)):
            # A restarted agent: what the previous process counted stays counted.
            entry.offset = tuple(o + last for o, last in zip(entry.offset, entry.last, strict=True))
        entry.last = tuple(values)
        after = self.counts(rank)
        for i, (b, a) in enumerate(zip(before, after, strict=True)):
            self._total[i] += a - b  # a >= b by construction

    def counts(self, rank: int) -> Counts:
        """`rank`'s restart-adjusted counters (zeros for a rank never seen)."""
        entry = self._entries.get(rank)
        if entry is None:
            return (0,) * self._width
        return tuple(o + last for o, last in zip(entry.offset, entry.last, strict=True))

    def start_unix_ns(self, rank: int) -> int:
        """When `rank`'s counters entered the ledger (Unix ns; 0 for a rank never seen)."""
        entry = self._entries.get(rank)
        return 0 if entry is None else entry.start_unix_ns

    @property
    def total(self) -> Counts:
        """The job's counters: the sum over every rank in the ledger."""
        return tuple(self._total)
