"""One self-contained HTML page: inline CSS and SVG, no scripts, nothing fetched from a network.

The only links are in-page anchors and relative links to the PNG files written beside the page.
"""

from __future__ import annotations

import html
from collections.abc import Mapping, Sequence

from mfuscope.cli.report._content import PLOT_NAMES, ReportContent
from mfuscope.core.aggregate.decompose import segment_label
from mfuscope.core.vocabulary import COMPONENTS

__all__ = ["render_html"]

_CSS = """
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;color:#222;
 max-width:1180px;margin:2em auto;padding:0 1em}
h1{font-size:1.6em;margin-bottom:.2em}h2{margin-top:2em;border-bottom:1px solid #ddd}
.meta{color:#666}.cards{display:flex;flex-wrap:wrap;gap:.8em;margin:1.2em 0}
.card{border:1px solid #ddd;border-radius:6px;padding:.6em 1em;min-width:8em}
.card b{display:block;font-size:1.5em}.card span{color:#666;font-size:.85em}
figure{margin:0;overflow-x:auto}figure svg{max-width:100%;height:auto}
table{border-collapse:collapse;margin:.8em 0;font-size:.9em}
th,td{border-bottom:1px solid #eee;padding:.25em .7em;text-align:right}
th:first-child,td:first-child{text-align:left}th{background:#f6f6f6}
.missing{color:#a33}.note{color:#555;font-size:.9em}nav a{margin-right:1em}
"""

_TITLES = {
    "decomposition": "Step decomposition per rank",
    "waterfall": "MFU waterfall",
    "kernel_classes": "Compute by kernel class",
    "utilization": "MFU and HFU over steps",
    "bandwidth": "Bus bandwidth per tier",
    "stragglers": "Stragglers",
}

_CAPTIONS = {
    "decomposition": "Mean step time of each rank, split into the step buckets: every instant "
    "of a step is compute, else recompute, else exposed communication (by axis/tier), else "
    "other (memory copies), else bubble (pipeline or idle). The buckets sum to the step.",
    "waterfall": "1 − MFU = exposed comm + bubble + recompute + other + compute × (1 − kernel "
    "efficiency), each as a share of the peak FLOPs the devices could have done (weighted by "
    "each device's peak). Kernel efficiency = model FLOPs / (peak × compute time). Where the "
    "steps carry their compute time by kernel class, the kernel slice is split: unfused kernels "
    "(elementwise, norms, reductions and other memory-bound kernels, the share fusion can win "
    "back) apart from the rest of kernel inefficiency.",
    "kernel_classes": "What the compute bucket ran, by kernel family (name rules in the analyze "
    "docs, 'Kernel classes'): gemm (matmuls, convolutions as implicit GEMM), attention, "
    "elementwise_norm_reduce (memory-bound: elementwise, norms, reductions, copies, embedding "
    "lookups, optimizers), other. Mean per step over the steps that carry a split.",
    "utilization": "MFU = model FLOPs / (peak FLOP/s × step time); HFU adds the recomputed "
    "FLOPs of activation checkpointing. Job-level per step: ratio of sums over ranks.",
    "bandwidth": "nccl-tests definitions: algbw = S / t, busbw = algbw × factor (2(n−1)/n "
    "all_reduce; (n−1)/n all_gather, reduce_scatter, all_to_all; 1 otherwise). Dotted: the "
    "tier's unidirectional spec. Dashed: the fitted alpha-beta model t = α + S·factor / β.",
    "stragglers": "Synchronous ranks share one wall time (the fast wait for the slow inside "
    "collectives), so the slow rank shows in its own time (wall - exposed communication - "
    "pipeline bubble), which counts a slow data loader's idle time too.",
}


def _e(value: object) -> str:
    return html.escape(str(value))


def _pct(ratio: float | None) -> str:
    return "–" if ratio is None else f"{ratio:.1%}"


def _si(value: float | None, unit: str) -> str:
    if value is None:
        return "–"
    for factor, prefix in ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= factor:
            return f"{value / factor:.3g} {prefix}{unit}"
    return f"{value:.3g} {unit}"


def _ms(seconds: float | None) -> str:
    return "–" if seconds is None else f"{seconds * 1e3:.2f} ms"


def _table(header: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    head = "".join(f"<th>{_e(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{_e(c)}</td>" for c in row) + "</tr>" for row in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _cards(content: ReportContent) -> str:
    run = content.run
    waterfall = content.waterfall
    fractions: dict[str, float | None] = {c: None for c in COMPONENTS}
    if content.decomposition:
        n = len(content.decomposition)
        for c in COMPONENTS:
            fractions[c] = sum(r.fraction(c) for r in content.decomposition) / n
    pipeline, idle = fractions["bubble_pipeline"], fractions["bubble_idle"]
    bubble = None if pipeline is None or idle is None else pipeline + idle
    dropped = sum(r.health.reports_dropped_total for r in run.ranks)
    cards = [
        ("MFU", _pct(content.overall[0] if content.overall else None), "model FLOPs / peak"),
        ("HFU", _pct(content.overall[1] if content.overall else None), "incl. recompute"),
        ("mean step", _ms(content.mean_step_s), f"{run.step_count} steps"),
        ("exposed comm", _pct(fractions["exposed_comm"]), "of the step, rank mean"),
        ("bubble", _pct(bubble), "pipeline + idle"),
        ("recompute", _pct(fractions["recompute"]), "of the step"),
        (
            "kernel efficiency",
            _pct(waterfall.kernel_efficiency if waterfall else None),
            "model FLOPs / (peak × compute)",
        ),
        ("reports dropped", str(dropped), "by the agents"),
    ]
    body = "".join(
        f'<div class="card"><span>{_e(t)}</span><b>{_e(v)}</b><span>{_e(n)}</span></div>'
        for t, v, n in cards
    )
    return f'<section class="cards">{body}</section>'


def _section_table(content: ReportContent, plot: str) -> str:
    if plot == "decomposition":
        labels = [s.label for s in content.decomposition[0].segments]
        rows = [
            [f"rank {r.rank}", r.steps, _ms(r.mean_step_s)]
            + [_pct(s.seconds / r.mean_step_s) for s in r.segments]
            for r in content.decomposition
        ]
        return _table(["rank", "steps", "mean step", *labels], rows)
    if plot == "waterfall" and content.waterfall:
        w = content.waterfall
        slices = [[s.label, _pct(s.fraction)] for s in w.slices] + [["MFU", _pct(w.mfu)]]
        return _table(["slice", "share of peak"], slices) + (
            f'<p class="note">{w.samples} (rank, step) samples; HFU {_pct(w.hfu)}.</p>'
        )
    if plot == "kernel_classes":
        classes = [c for c, _ in content.kernel_classes[0].seconds]
        rows = [
            [f"rank {r.rank}", r.steps, _ms(r.compute_s)] + [_pct(r.share(c)) for c in classes]
            for r in content.kernel_classes
        ]
        return _table(["rank", "steps", "compute / step", *classes], rows)
    if plot == "bandwidth":
        return "".join(_tier_tables(content))
    if plot == "stragglers":
        rows = [
            [
                f"rank {p.rank}",
                _ms(p.median_step_s),
                f"{p.step_ratio:.3f}",
                _ms(p.median_own_s),
                "–" if p.own_ratio is None else f"{p.own_ratio:.3f}",
            ]
            for p in content.stragglers.ranks
        ]
        return _table(["rank", "median step", "ratio", "median own time", "own-time ratio"], rows)
    return ""


def _tier_tables(content: ReportContent) -> list[str]:
    parts = []
    for tier in content.bandwidth:
        spec = max((p for _, p in tier.specs), default=None)
        # Each point against its own axis's spec: across nodes, groups on one tier differ (a dp
        # group with one rank per node drives one NIC, the world group all of them).
        spec_of: dict[str, float] = {}
        for axis, peak in tier.specs:
            spec_of[axis] = max(spec_of.get(axis, 0.0), peak)
        rows = [
            [
                p.op,
                p.axis,
                p.group_size,
                _si(p.size_bytes, "B"),
                p.calls,
                f"{p.seconds_per_call * 1e6:.1f} µs",
                _si(p.busbw_bytes_per_s, "B/s"),
                _pct(p.busbw_bytes_per_s / spec_of[p.axis]) if p.axis in spec_of else "–",
            ]
            for p in tier.points
        ]
        parts.append(f"<h3>{_e(tier.tier)}</h3>")
        parts.append(
            _table(["op", "axis", "n", "S", "calls", "time/call", "busbw", "of spec"], rows)
        )
        fit = tier.fit
        if fit is None:
            parts.append(
                '<p class="note">No alpha-beta fit: it needs 2+ distinct sizes with '
                "time growing with size.</p>"
            )
            continue
        beta = fit.link.beta_bytes_per_s
        below = sum(1 for p in tier.points if p.bus_bytes < fit.half_bandwidth_bytes)
        parts.append(
            f'<p class="note">Fit over {fit.points} sizes: α = {fit.link.alpha_s * 1e6:.1f} µs, '
            f"β = {_e(_si(beta, 'B/s'))}"
            + (
                f" ({_pct(beta / spec)} of the {_e(_si(spec, 'B/s'))} spec)"
                if spec
                else " (no spec figure for this tier)"
            )
            + f", relative RMS error {_pct(fit.rms_relative_error)}. "
            f"n½ = α·β = {_e(_si(fit.half_bandwidth_bytes, 'B'))} (bus bytes): smaller transfers "
            f"are latency-bound; {below} of {len(tier.points)} observed sizes are.</p>"
        )
    return parts


def _ranks_table(content: ReportContent) -> str:
    rows = []
    for r in content.run.ranks:
        h = r.health
        rows.append(
            [
                f"rank {r.rank}",
                r.host,
                r.device,
                _si(r.peak_flops, "FLOP/s"),
                r.peak_source,
                len(r.steps),
                sum(1 for s in r.steps if s.components),
                h.windows_analysed_total,
                h.reports_dropped_total,
                h.send_failures_total,
                h.profiler_failures_total,
            ]
        )
    header = [
        "rank",
        "host",
        "device",
        "peak",
        "peak source",
        "steps",
        "decomposed",
        "windows",
        "dropped",
        "send failures",
        "profiler failures",
    ]
    groups = {
        (
            g.axis,
            g.tier,
            g.size,
            g.spans_hosts,
            g.link_peak_bytes_per_s,
            g.link_peak_source or "not stated",
        )
        for r in content.run.ranks
        for g in (r.topology.groups if r.topology else ())
    }
    topo = (
        _table(
            ["axis", "tier", "size", "spans hosts", "link spec", "spec source"],
            [
                [a, t, n, "yes" if s else "no", "unknown" if p is None else _si(p, "B/s"), src]
                for a, t, n, s, p, src in sorted(groups, key=str)
            ],
        )
        if groups
        else ""
    )
    return _table(header, rows) + topo


def render_html(content: ReportContent, svgs: Mapping[str, str], generated: str) -> str:
    """The page. `svgs` maps plot names (`PLOT_NAMES`) to inline SVG markup; absent = missing."""
    run = content.run
    devices = ", ".join(sorted({r.device for r in run.ranks}))
    parts = [
        "<!doctype html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>mfuscope report: {_e(run.job)}</title><style>{_CSS}</style></head><body>",
        f"<h1>mfuscope report: {_e(run.job)}</h1>",
        f'<p class="meta">{_e(run.source)} · {len(run.ranks)} of {run.world_size} ranks · '
        f"{run.step_count} steps · {_e(devices)} · generated {_e(generated)}</p>",
        "<nav>"
        + "".join(f'<a href="#plot-{p}">{_e(_TITLES[p])}</a>' for p in PLOT_NAMES)
        + "</nav>",
        _cards(content),
    ]
    for plot in PLOT_NAMES:
        parts.append(f'<section><h2 id="section-{plot}">{_e(_TITLES[plot])}</h2>')
        reason = content.missing(plot)
        if reason or plot not in svgs:
            parts.append(
                f'<figure id="plot-{plot}"><p class="missing">Not available: '
                f"{_e(reason or 'not drawn')}.</p></figure></section>"
            )
            continue
        parts.append(f'<figure id="plot-{plot}">{svgs[plot]}</figure>')
        parts.append(f'<p class="note">{_e(_CAPTIONS[plot])} <a href="{_e(plot)}.png">PNG</a></p>')
        parts.append(_section_table(content, plot) + "</section>")
    parts.append("<section><h2>Ranks and topology</h2>" + _ranks_table(content) + "</section>")
    parts.append(
        f'<p class="note">Buckets: {_e(", ".join(segment_label(c) for c in COMPONENTS))}'
        ". Ratios are 0..1 in the data, shown as percent here.</p></body></html>"
    )
    return "\n".join(parts) + "\n"
