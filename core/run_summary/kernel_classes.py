"""Compute time by kernel class, per rank: what the compute bucket ran (pure).

Definitions: docs/analyze.md, "Kernel classes", and
docs/definitions.md#unfused-and-memory-bound-kernels. Each step report may carry its compute
seconds split by class (`StepReport.compute_classes`, scaled from the step's profiled window like
its buckets); a rank's split is the mean per step over its measured steps (`coverage.is_measured`:
the steps of a profiled window, as for the decomposition: a carried split is an earlier window's,
scaled, and would weight that window by the steps that followed it) that carry one, so it sums to
that rank's mean compute time over those steps. Steps without a split (CPU timelines, agents
that sent none) are left out, never counted as zeros.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from mfuscope.core.run_summary.coverage import is_measured
from mfuscope.core.run_summary.run_data import RunData
from mfuscope.core.vocabulary import KERNEL_CLASSES

__all__ = ["RankClassSplit", "class_split_per_rank"]


@dataclass(frozen=True)
class RankClassSplit:
    """One rank's mean compute seconds per step by kernel class (every class of
    `KERNEL_CLASSES`, in its order), over `steps` measured steps that carry a split."""

    rank: int
    steps: int
    seconds: tuple[tuple[str, float], ...]

    @property
    def compute_s(self) -> float:
        return math.fsum(s for _, s in self.seconds)

    def share(self, kernel_class: str) -> float:
        """The class's share of the compute time, a ratio 0..1 (0 without compute)."""
        total = self.compute_s
        seconds = dict(self.seconds).get(kernel_class, 0.0)
        return seconds / total if total > 0 else 0.0


def class_split_per_rank(run: RunData) -> tuple[RankClassSplit, ...]:
    """Per rank with at least one measured step carrying a class split, its mean split per
    measured step."""
    out = []
    for rank in run.ranks:
        steps = [s for s in rank.steps if s.compute_classes and is_measured(s)]
        if not steps:
            continue
        sums: dict[str, list[float]] = {c: [] for c in KERNEL_CLASSES}
        for step in steps:
            for share in step.compute_classes:
                sums.setdefault(share.kernel_class, []).append(share.seconds)
        seconds = tuple((c, math.fsum(v) / len(steps)) for c, v in sums.items())
        out.append(RankClassSplit(rank.rank, len(steps), seconds))
    return tuple(out)
