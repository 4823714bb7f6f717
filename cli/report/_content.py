"""Everything the report shows, computed once from a `RunData` (pure)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from mfuscope.core.run_summary.breakdowns import (
    RankDecomposition,
    StepUtilization,
    Waterfall,
    decomposition_per_rank,
    job_waterfall,
    overall_utilization,
    utilization_over_steps,
)
from mfuscope.core.run_summary.coverage import Coverage, coverage
from mfuscope.core.run_summary.kernel_classes import RankClassSplit, class_split_per_rank
from mfuscope.core.run_summary.rank_pace import StragglerView, straggler_view
from mfuscope.core.run_summary.run_data import RunData
from mfuscope.core.run_summary.tier_bandwidth import TierBandwidth, bandwidth_by_tier

__all__ = ["PLOT_NAMES", "ReportContent", "build_content"]

# The plots, in page order; each is `<figure id="plot-NAME">` in the HTML and `NAME.png`.
PLOT_NAMES: tuple[str, ...] = (
    "decomposition",
    "waterfall",
    "kernel_classes",
    "utilization",
    "bandwidth",
    "stragglers",
)


@dataclass(frozen=True)
class ReportContent:
    run: RunData
    decomposition: tuple[RankDecomposition, ...]
    waterfall: Waterfall | None
    utilization: tuple[StepUtilization, ...]
    overall: tuple[float, float] | None  # (MFU, HFU) over every step
    bandwidth: tuple[TierBandwidth, ...]
    stragglers: StragglerView
    mean_step_s: float
    coverage: Coverage
    kernel_classes: tuple[RankClassSplit, ...] = ()

    def missing(self, plot: str) -> str | None:
        """Why `plot` cannot be drawn, or None when it has data."""
        flops = (
            "model FLOPs are unknown (pass --model-flops-per-step)"
            if not self.run.flops_known
            else "no rank reported a peak FLOP/s (pass --peak-flops)"
        )
        reasons = {
            "decomposition": None
            if self.decomposition
            else "no step was measured in a profiled window",
            "waterfall": None
            if self.waterfall
            else flops + " or no step was measured in a profiled window",
            "kernel_classes": None
            if self.kernel_classes
            else "no measured step carries its compute time by kernel class (CPU timelines "
            "have none)",
            "utilization": None if self.utilization else flops,
            "bandwidth": None
            if self.bandwidth
            else "no collective with a known size was observed in a profiled window",
            "stragglers": None if self.stragglers.ranks else "no step reports",
        }
        return reasons[plot]


def build_content(run: RunData) -> ReportContent:
    """Aggregate `run` for every section of the report."""
    walls = [s.wall_s for r in run.ranks for s in r.steps]
    return ReportContent(
        run=run,
        decomposition=decomposition_per_rank(run),
        waterfall=job_waterfall(run),
        utilization=utilization_over_steps(run),
        overall=overall_utilization(run),
        bandwidth=bandwidth_by_tier(run),
        stragglers=straggler_view(run),
        mean_step_s=math.fsum(walls) / len(walls) if walls else 0.0,
        coverage=coverage(run),
        kernel_classes=class_split_per_rank(run),
    )
