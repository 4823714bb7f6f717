"""The report's bus-bandwidth plot: a size axis that can be read, and why a tier has no fit."""

from __future__ import annotations

import pytest

pytest.importorskip("matplotlib")

from matplotlib.axes import Axes
from mfuscope.cli.report._plots import plot_bandwidth
from mfuscope.core.comm_fit import fit_alpha_beta
from mfuscope.core.run_summary.tier_bandwidth import BandwidthPoint, TierBandwidth


def _tier(sizes_and_seconds: list[tuple[int, float]]) -> TierBandwidth:
    points = tuple(
        BandwidthPoint("all_reduce", "dp", "intra_node", 2, size, 4, seconds)
        for size, seconds in sizes_and_seconds
    )
    fit = fit_alpha_beta([p.size_bytes for p in points], [p.seconds_per_call for p in points])
    return TierBandwidth("intra_node", points, (), fit)


def _axes(tier: TierBandwidth) -> Axes:
    return plot_bandwidth([tier]).axes[0]


def test_sizes_within_a_decade_get_a_linear_axis_and_say_why_there_is_no_fit() -> None:
    # gloo's DDP buckets: four sizes within 7 %, the largest the fastest (no positive slope)
    ax = _axes(_tier([(264_000, 3.2e-3), (266_000, 1.9e-3), (267_000, 2.3e-3), (282_000, 1.5e-3)]))
    assert ax.get_xscale() == "linear"
    assert "time does not grow with size" in ax.get_title()


def test_one_size_needs_more_sizes() -> None:
    ax = _axes(_tier([(1 << 20, 1e-3), (1 << 20, 1.1e-3)]))
    assert "needs 2+ sizes" in ax.get_title()


def test_sizes_over_decades_get_a_log_axis_and_the_fit() -> None:
    ax = _axes(_tier([(1 << 10, 2e-5), (1 << 20, 1e-4), (1 << 26, 5e-3)]))
    assert ax.get_xscale() == "log"
    assert "fit: α=" in ax.get_title()
