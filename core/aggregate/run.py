"""Moved to `mfuscope.core.run_summary.run_data`.

This old path re-exports its names and warns; it goes in mfuscope 0.3.0.
"""

from __future__ import annotations

from mfuscope.core.moved import warn_moved
from mfuscope.core.run_summary.run_data import Launches, RankRun, RunData, jobs_in, merge_batches

__all__ = ["Launches", "RankRun", "RunData", "jobs_in", "merge_batches"]

warn_moved(__name__, "mfuscope.core.run_summary.run_data")
