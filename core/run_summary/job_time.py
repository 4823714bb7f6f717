"""The job-time ledger of a run replayed from its agents' batches (pure): the same booking as the
collector's (`core.ledger.book_batch`, docs/definitions.md#job-time-ledger), so the report and
`compare` give the collector's figures for the same batches."""

from __future__ import annotations

from dataclasses import dataclass, field

from mfuscope.core.ledger import CATEGORIES, Booked, effective_mfu

__all__ = ["JobTime", "JobTimeTally"]

_INDEX = {category: i for i, category in enumerate(CATEGORIES)}


@dataclass(frozen=True)
class JobTime:
    """Rank-seconds per category (`CATEGORIES` order; all 0 when no agent sent a ledger), the
    model FLOPs of the steps not redone, and Σ peak FLOP/s x rank-seconds (FLOP)."""

    seconds: tuple[float, ...] = (0.0,) * len(CATEGORIES)
    useful_model_flops: float = 0.0
    peak_flop_seconds: float = 0.0

    @property
    def rank_seconds(self) -> float:
        return sum(self.seconds)

    @property
    def effective_mfu(self) -> float | None:
        return effective_mfu(self.useful_model_flops, self.peak_flop_seconds)

    def shares(self) -> tuple[tuple[str, float], ...]:
        """(category, share of the rank-seconds) of the categories with time, largest first."""
        total = self.rank_seconds
        if not total > 0:
            return ()
        found = [(c, s / total) for c, s in zip(CATEGORIES, self.seconds, strict=True) if s > 0]
        return tuple(sorted(found, key=lambda cs: -cs[1]))


@dataclass
class JobTimeTally:
    """What the replay books, as the collector's counters do (integer ns per category)."""

    ns: list[int] = field(default_factory=lambda: [0] * len(CATEGORIES))
    useful_model_flops: float = 0.0
    peak_flop_seconds: float = 0.0

    def add(self, booked: Booked, peak_flops: float | None) -> None:
        total = 0
        for category, ns in booked:
            self.ns[_INDEX[category]] += ns
            total += ns
        if peak_flops is not None:
            self.peak_flop_seconds += peak_flops * total / 1e9

    def result(self) -> JobTime:
        return JobTime(
            tuple(ns / 1e9 for ns in self.ns), self.useful_model_flops, self.peak_flop_seconds
        )
