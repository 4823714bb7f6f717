"""Moved to `mfuscope.core.run_summary.kernel_classes`.

This old path re-exports its names and warns; it goes in mfuscope 0.3.0.
"""

from __future__ import annotations

from mfuscope.core._moved import warn_moved
from mfuscope.core.run_summary.kernel_classes import RankClassSplit, class_split_per_rank

__all__ = ["RankClassSplit", "class_split_per_rank"]

warn_moved(__name__, "mfuscope.core.run_summary.kernel_classes")
