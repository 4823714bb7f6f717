"""The report's figures, drawn with matplotlib's object API (no pyplot, no global figure state).

Each `plot_*` takes an aggregate from the pure modules and returns a `Figure`; `render` turns one
into inline SVG text (text kept as text, no timestamp, so the HTML is small and reproducible) and
PNG bytes. Data stay in base units; only the axes show ms, GB/s and percent.
"""

from __future__ import annotations

import io
import math
import re
from collections.abc import Sequence

import matplotlib
from matplotlib.colors import TwoSlopeNorm
from matplotlib.figure import Figure
from matplotlib.ticker import EngFormatter, MaxNLocator
from mfuscope.cli.report._content import ReportContent
from mfuscope.core.bandwidth import LinkModel, bus_factor, ideal_transfer_s
from mfuscope.core.run_summary.breakdowns import (
    KERNEL_INEFFICIENCY,
    UNFUSED_KERNELS,
    RankDecomposition,
    StepUtilization,
    Waterfall,
)
from mfuscope.core.run_summary.kernel_classes import RankClassSplit
from mfuscope.core.run_summary.rank_pace import StragglerView
from mfuscope.core.run_summary.tier_bandwidth import TierBandwidth
from mfuscope.core.stragglers import STRAGGLER_MIN_RATIO

__all__ = [
    "draw",
    "plot_bandwidth",
    "plot_decomposition",
    "plot_kernel_classes",
    "plot_stragglers",
    "plot_utilization",
    "plot_waterfall",
    "render",
]

BUCKET_COLORS = {
    "compute": "#4C72B0",
    "recompute": "#8172B3",
    "other": "#937860",
    "bubble_pipeline": "#DD8452",
    "bubble_idle": "#B0B0B0",
    "instrumentation": "#64B5CD",
}
EXPOSED_COMM_COLORS = ("#C44E52", "#E17C7F", "#8C2D30", "#F0A5A7")
KERNEL_COLOR = "#55A868"
UNFUSED_COLOR = "#CCB974"
CLASS_COLORS = {
    "gemm": "#4C72B0",
    "attention": "#8172B3",
    "elementwise_norm_reduce": UNFUSED_COLOR,
    "other": "#B0B0B0",
}
OP_COLORS = {
    "all_reduce": "#4C72B0",
    "all_gather": "#55A868",
    "reduce_scatter": "#C44E52",
    "all_to_all": "#8172B3",
    "broadcast": "#CCB974",
    "reduce": "#64B5CD",
    "send": "#DD8452",
    "recv": "#937860",
}
GB = 1e9
_METADATA = re.compile(r"<metadata>.*?</metadata>\s*", re.DOTALL)


def _color(component: str, comm_index: int) -> str:
    if component == "exposed_comm":
        return EXPOSED_COMM_COLORS[comm_index % len(EXPOSED_COMM_COLORS)]
    return BUCKET_COLORS.get(component, "#777777")


def render(fig: Figure, salt: str, png_dpi: int = 110, *, png: bool = True) -> tuple[str, bytes]:
    """(inline SVG markup starting at ``<svg``, PNG bytes) of `fig`; the PNG is empty when not
    wanted (`png=False`: a page alone, where drawing it costs as much as the SVG)."""
    svg_buf, png_buf = io.BytesIO(), io.BytesIO()
    # Text as <text> (no glyph paths) and a per-figure id salt, so several SVGs share one page.
    with matplotlib.rc_context({"svg.fonttype": "none", "svg.hashsalt": salt}):
        fig.savefig(svg_buf, format="svg", metadata={"Date": None}, bbox_inches="tight")
    if png:
        fig.savefig(png_buf, format="png", dpi=png_dpi, bbox_inches="tight")
    svg = svg_buf.getvalue().decode("utf-8")
    # Drop the XML prologue and the RDF <metadata> block (creator URLs the page does not need).
    svg = _METADATA.sub("", svg[svg.index("<svg") :])
    return svg, png_buf.getvalue()


def plot_decomposition(ranks: Sequence[RankDecomposition]) -> Figure:
    """Stacked bars: mean step time per rank split into buckets (ms)."""
    fig = Figure(figsize=(max(5.0, 1.2 * len(ranks) + 3.5), 4.0))
    ax = fig.add_subplot()
    labels = [f"rank {r.rank}" for r in ranks]
    bottoms = [0.0] * len(ranks)
    comm_index = 0
    for i, segment in enumerate(ranks[0].segments):
        heights = [r.segments[i].seconds * 1e3 for r in ranks]
        ax.bar(
            labels,
            heights,
            bottom=bottoms,
            label=segment.label,
            color=_color(segment.component, comm_index),
            width=0.6,
        )
        comm_index += segment.component == "exposed_comm"
        bottoms = [b + h for b, h in zip(bottoms, heights, strict=True)]
    ax.set_ylabel("mean step time (ms)")
    steps = sorted({r.steps for r in ranks})
    ax.set_title(
        f"Step decomposition per rank (mean over the {'/'.join(map(str, steps))} steps "
        "measured in profiled windows)",
        fontsize=10,
    )
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    ax.grid(axis="y", alpha=0.3)
    return fig


def plot_waterfall(waterfall: Waterfall) -> Figure:
    """From 100 % of peak down, slice by slice, to MFU (percent of peak FLOPs)."""
    fig = Figure(figsize=(8.0, 4.2))
    ax = fig.add_subplot()
    names = ["peak", *(s.label for s in waterfall.slices), "MFU"]
    level = 1.0
    comm_index = 0
    ax.bar(0, 100.0, color="#DDDDDD", width=0.7)
    for i, piece in enumerate(waterfall.slices, start=1):
        level -= piece.fraction
        if piece.component == KERNEL_INEFFICIENCY:
            color = KERNEL_COLOR
        elif piece.component == UNFUSED_KERNELS:
            color = UNFUSED_COLOR
        else:
            color = _color(piece.component, comm_index)
            comm_index += piece.component == "exposed_comm"
        ax.bar(i, piece.fraction * 100, bottom=level * 100, color=color, width=0.7)
        ax.annotate(
            f"{piece.fraction:.1%}",
            (i, (level + max(piece.fraction, 0)) * 100),
            ha="center",
            va="bottom",
            fontsize=8,
        )
    ax.bar(len(names) - 1, waterfall.mfu * 100, color="#2B2B2B", width=0.7)
    ax.annotate(
        f"MFU {waterfall.mfu:.1%}\nHFU {waterfall.hfu:.1%}",
        (len(names) - 1, waterfall.mfu * 100),
        ha="center",
        va="bottom",
        fontsize=8,
    )
    ax.set_xticks(range(len(names)), names, rotation=25, ha="right")
    ax.set_ylabel("% of peak FLOPs")
    ax.set_ylim(min(0.0, 100 * min(s.fraction for s in waterfall.slices)), 108)
    ax.set_title(
        f"MFU waterfall over the {waterfall.samples} measured rank-steps: where the peak goes",
        fontsize=10,
    )
    ax.grid(axis="y", alpha=0.3)
    return fig


def plot_kernel_classes(ranks: Sequence[RankClassSplit]) -> Figure:
    """Stacked horizontal bars: each rank's compute time split by kernel class (percent)."""
    fig = Figure(figsize=(8.0, max(2.4, 0.45 * len(ranks) + 1.6)))
    ax = fig.add_subplot()
    y = list(range(len(ranks)))
    lefts = [0.0] * len(ranks)
    for kernel_class, _ in ranks[0].seconds:
        widths = [100 * r.share(kernel_class) for r in ranks]
        ax.barh(
            y,
            widths,
            left=lefts,
            height=0.6,
            color=CLASS_COLORS.get(kernel_class, "#777777"),
            label=kernel_class,
        )
        lefts = [left + w for left, w in zip(lefts, widths, strict=True)]
    ax.set_yticks(y, [f"rank {r.rank}" for r in ranks])
    ax.invert_yaxis()
    ax.set_xlim(0, 100)
    ax.set_xlabel("% of compute time")
    ax.set_title("Compute time by kernel class")
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    ax.grid(axis="x", alpha=0.3)
    return fig


def plot_utilization(
    series: Sequence[StepUtilization], windows: Sequence[tuple[int, int]] = ()
) -> Figure:
    """MFU and HFU of the job per step (percent), the profiled windows shaded."""
    fig = Figure(figsize=(8.0, 3.6))
    ax = fig.add_subplot()
    for index, (first, last) in enumerate(windows):
        ax.axvspan(
            first - 0.5,
            last + 0.5,
            color="#F2C14E",
            alpha=0.35,
            linewidth=0,
            label="profiled window (breakdown measured)" if index == 0 else None,
        )
    steps = [s.step for s in series]
    marker = "o" if len(series) <= 60 else None
    ax.plot(
        steps,
        [s.hfu * 100 for s in series],
        label="HFU",
        color="#8172B3",
        marker=marker,
        markersize=3,
    )
    ax.plot(
        steps,
        [s.mfu * 100 for s in series],
        label="MFU",
        color="#4C72B0",
        marker=marker,
        markersize=3,
    )
    ax.set_xlabel("step")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # steps are whole numbers
    ax.set_ylabel("% of peak FLOPs")
    top = max([s.hfu for s in series] + [s.mfu for s in series]) * 100
    ax.set_ylim(0, top * 1.15 if top > 0 else 1.0)
    ax.set_title("MFU and HFU per step (all ranks)")
    ax.legend(frameon=False)
    ax.grid(alpha=0.3)
    return fig


def _fit_curve(link: LinkModel, op: str, group_size: int, sizes: list[float]) -> list[float]:
    factor = bus_factor(op, group_size)
    return [s * factor / ideal_transfer_s(link, s * factor) / GB for s in sizes]


def plot_bandwidth(tiers: Sequence[TierBandwidth]) -> Figure:
    """Per tier: busbw (GB/s) against message size S (log when it spans a decade or more), the
    spec line and the fitted curve."""
    fig = Figure(figsize=(max(6.0, 5.2 * len(tiers)), 4.2))
    for index, tier in enumerate(tiers, start=1):
        ax = fig.add_subplot(1, len(tiers), index)
        ops = sorted({(p.op, p.group_size) for p in tier.points})
        for op, n in ops:
            pts = [p for p in tier.points if (p.op, p.group_size) == (op, n)]
            color = OP_COLORS.get(op, "#777777")
            ax.scatter(
                [p.size_bytes for p in pts],
                [p.busbw_bytes_per_s / GB for p in pts],
                s=18,
                color=color,
                label=f"{op} (n={n})",
                zorder=3,
            )
            if tier.fit is not None:
                lo = max(min(p.size_bytes for p in tier.points), 1)
                hi = max(max(p.size_bytes for p in tier.points), 2 * lo)
                grid = [lo * (hi / lo) ** (k / 40) for k in range(41)]
                ax.plot(
                    grid,
                    _fit_curve(tier.fit.link, op, n, grid),
                    color=color,
                    linestyle="--",
                    linewidth=1,
                )
        axes_by_peak: dict[float, list[str]] = {}
        for axis, peak in tier.specs:
            axes_by_peak.setdefault(peak, []).append(axis)
        for peak, axes in sorted(axes_by_peak.items()):
            ax.axhline(
                peak / GB,
                color="#2B2B2B",
                linestyle=":",
                linewidth=1.2,
                label=f"spec ({', '.join(axes)}): {peak / GB:.3g} GB/s",
            )
        best = tier.best_busbw_bytes_per_s
        if tier.specs and max(p for _, p in tier.specs) > 20 * best:
            ax.set_yscale("log")
        sizes = {p.size_bytes for p in tier.points}
        if sizes and max(sizes) >= 10 * max(min(sizes), 1):
            ax.set_xscale("log")
        else:
            # Within a decade a log axis has no major tick, and its minor labels overlap.
            ax.xaxis.set_major_formatter(EngFormatter(unit="B"))
            ax.tick_params(axis="x", labelrotation=30)
        ax.set_xlabel("message size S (bytes)")
        ax.set_ylabel("bus bandwidth (GB/s)")
        fit = tier.fit
        if fit is not None:
            fitted = (
                f"fit: α={fit.link.alpha_s * 1e6:.1f} µs, "
                f"β={fit.link.beta_bytes_per_s / GB:.2f} GB/s"
            )
        elif len(sizes) < 2:
            fitted = "no alpha-beta fit (needs 2+ sizes)"
        else:  # core.comm_fit: no positive slope of time on size
            fitted = "no alpha-beta fit (time does not grow with size here)"
        ax.set_title(f"{tier.tier}\n{fitted}", fontsize=10)
        ax.legend(fontsize=8, frameon=False)
        ax.grid(alpha=0.3, which="both")
    return fig


def plot_stragglers(view: StragglerView, windows: Sequence[tuple[int, int]] = ()) -> Figure:
    """Left: each rank's straggler ratio against the threshold. Right: per-step heat map."""
    fig = Figure(figsize=(10.0, max(3.2, 0.35 * len(view.ranks) + 2.4)))
    bars, heat = fig.subplots(1, 2, gridspec_kw={"width_ratios": [1, 2]})
    ranks = [p.rank for p in view.ranks]
    y = list(range(len(ranks)))
    named = {s.rank for s in view.named}
    basis = "own time (wall - exposed comm - pipeline bubble)" if view.basis == "self" else "wall"
    bars.barh(
        y,
        [p.ratio for p in view.ranks],
        height=0.6,
        color=["#C44E52" if p.rank in named else "#4C72B0" for p in view.ranks],
        label=f"median {basis}, last reports",
    )
    bars.axvline(1.0, color="#2B2B2B", linewidth=1)
    bars.axvline(
        STRAGGLER_MIN_RATIO,
        color="#C44E52",
        linestyle="--",
        linewidth=1,
        label=f"straggler above ×{STRAGGLER_MIN_RATIO:.2f}",
    )
    bars.set_xlim(0, max([STRAGGLER_MIN_RATIO * 1.1] + [p.ratio * 1.05 for p in view.ranks]))
    bars.set_yticks(y, [f"rank {r}" for r in ranks])
    bars.invert_yaxis()
    bars.set_xlabel("straggler ratio (/ job median)")
    bars.set_title("Straggler ratio per rank")
    bars.legend(fontsize=8, frameon=False, loc="upper center", bbox_to_anchor=(0.5, -0.18))
    # A dense step axis (missing steps blank) so the heat map's x axis is the step number.
    first, last = view.steps[0], view.steps[-1]
    values = [[math.nan] * (last - first + 1) for _ in ranks]
    for row, relative in zip(values, view.relative_step_time, strict=True):
        for step, value in zip(view.steps, relative, strict=True):
            row[step - first] = math.nan if value is None else value
    spread = max([abs(v - 1.0) for row in values for v in row if not math.isnan(v)] + [0.05])
    image = heat.imshow(
        values,
        aspect="auto",
        interpolation="nearest",
        cmap="coolwarm",
        norm=TwoSlopeNorm(1.0, 1.0 - spread, 1.0 + spread),
        extent=(first - 0.5, last + 0.5, len(ranks) - 0.5, -0.5),
    )
    for first_step, last_step in windows:
        heat.axvspan(
            first_step - 0.5, last_step + 0.5, fill=False, edgecolor="#2B2B2B", linewidth=1.0
        )
    heat.set_yticks(y, [f"rank {r}" for r in ranks])
    heat.set_xlabel("step" + (" (outlined: profiled windows)" if windows else ""))
    heat.xaxis.set_major_locator(MaxNLocator(integer=True))
    heat.set_title("Step wall time / that step's median over ranks")
    fig.colorbar(image, ax=heat, fraction=0.05)
    return fig


def draw(plot: str, content: ReportContent) -> Figure | None:
    """The figure for one of `PLOT_NAMES`, or None when `content` has no data for it."""
    if content.missing(plot):
        return None
    if plot == "decomposition":
        return plot_decomposition(content.decomposition)
    if plot == "waterfall":
        return plot_waterfall(content.waterfall) if content.waterfall else None
    if plot == "kernel_classes":
        return plot_kernel_classes(content.kernel_classes)
    if plot == "utilization":
        return plot_utilization(content.utilization, content.coverage.window_ranges)
    if plot == "bandwidth":
        return plot_bandwidth(content.bandwidth)
    if plot == "stragglers":
        return plot_stragglers(content.stragglers, content.coverage.window_ranges)
    raise ValueError(f"unknown plot {plot!r}")
