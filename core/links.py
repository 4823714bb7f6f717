"""Moved to `mfuscope.core.interconnects`.

This old path re-exports its names and warns; it goes in mfuscope 0.3.0.
"""

from __future__ import annotations

from mfuscope.core.interconnects import (
    LINK_KINDS,
    LINK_TIERS,
    NVLINK_PER_LINK_BYTES_PER_S,
    PCIE_PER_LANE_BYTES_PER_S,
    DetectedLinks,
    LinkTier,
    detected_inter_node_link,
    detected_intra_node_link,
    link_tier,
)
from mfuscope.core.moved import warn_moved

__all__ = [
    "LINK_KINDS",
    "LINK_TIERS",
    "NVLINK_PER_LINK_BYTES_PER_S",
    "PCIE_PER_LANE_BYTES_PER_S",
    "DetectedLinks",
    "LinkTier",
    "detected_inter_node_link",
    "detected_intra_node_link",
    "link_tier",
]

warn_moved(__name__, "mfuscope.core.interconnects")
