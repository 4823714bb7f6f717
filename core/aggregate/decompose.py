"""Moved to `mfuscope.core.run_summary.breakdowns`.

This old path re-exports its names and warns; it goes in mfuscope 0.3.0.
"""

from __future__ import annotations

from mfuscope.core.moved import warn_moved
from mfuscope.core.run_summary.breakdowns import (
    RankDecomposition,
    Segment,
    StepUtilization,
    Waterfall,
    WaterfallSlice,
    decomposition_per_rank,
    job_waterfall,
    overall_utilization,
    segment_label,
    utilization_over_steps,
)

__all__ = [
    "RankDecomposition",
    "Segment",
    "StepUtilization",
    "Waterfall",
    "WaterfallSlice",
    "decomposition_per_rank",
    "job_waterfall",
    "overall_utilization",
    "segment_label",
    "utilization_over_steps",
]

warn_moved(__name__, "mfuscope.core.run_summary.breakdowns")
