"""Moved to `mfuscope.core.run_summary.tier_bandwidth`.

This old path re-exports its names and warns; it goes in mfuscope 0.3.0.
"""

from __future__ import annotations

from mfuscope.core.moved import warn_moved
from mfuscope.core.run_summary.tier_bandwidth import (
    BandwidthPoint,
    TierBandwidth,
    bandwidth_by_tier,
)

__all__ = ["BandwidthPoint", "TierBandwidth", "bandwidth_by_tier"]

warn_moved(__name__, "mfuscope.core.run_summary.tier_bandwidth")
