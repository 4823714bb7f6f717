"""Moved to `mfuscope.core.run_summary.coverage`.

This old path re-exports its names and warns; it goes in mfuscope 0.3.0.
"""

from __future__ import annotations

from mfuscope.core._moved import warn_moved
from mfuscope.core.run_summary.coverage import (
    Coverage,
    RankCoverage,
    coverage,
    is_measured,
    rank_coverage,
)

__all__ = ["Coverage", "RankCoverage", "coverage", "is_measured", "rank_coverage"]

warn_moved(__name__, "mfuscope.core.run_summary.coverage")
