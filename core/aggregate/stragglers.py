"""Moved to `mfuscope.core.run_summary.rank_pace`.

This old path re-exports its names and warns; it goes in mfuscope 0.3.0.
"""

from __future__ import annotations

from mfuscope.core.moved import warn_moved
from mfuscope.core.run_summary.rank_pace import RankPace, StragglerView, straggler_view

__all__ = ["RankPace", "StragglerView", "straggler_view"]

warn_moved(__name__, "mfuscope.core.run_summary.rank_pace")
