"""One self-contained HTML page: inline CSS and SVG, no scripts, nothing fetched from a network.

The only links are in-page anchors and relative links to the PNG files written beside the page.
"""

from __future__ import annotations

import html
from collections.abc import Mapping, Sequence

from mfuscope.cli.report._content import PLOT_NAMES, ReportContent
from mfuscope.core.bandwidth import busbw_efficiency
from mfuscope.core.run_summary.breakdowns import segment_label
from mfuscope.core.run_summary.run_data import RunData
from mfuscope.core.stragglers import STRAGGLER_MIN_RATIO
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
    "decomposition": "Mean step time of each rank over the steps measured in profiled windows, "
    "split into the step buckets: every instant of a step is compute, else recompute, else "
    "exposed communication (by axis/tier), else other (memory copies), else bubble (pipeline or "
    "idle). The buckets sum to the step. Steps between windows carry the latest window's "
    "breakdown and are not averaged here.",
    "waterfall": "Over the steps measured in profiled windows: 1 − MFU = exposed comm + bubble + "
    "recompute + other + compute × (1 − kernel efficiency), each as a share of the peak FLOPs the "
    "devices could have done (weighted by each device's peak). Kernel efficiency = model FLOPs "
    "/ (peak × compute time). Where the steps carry their compute time by kernel class, the "
    "kernel slice is split: unfused kernels (elementwise, norms, reductions and other "
    "memory-bound kernels, the share fusion can win back) apart from the rest of kernel "
    "inefficiency. Its MFU is that of those steps; the MFU card covers every step.",
    "kernel_classes": "What the compute bucket ran, by kernel family (name rules in the analyze "
    "docs, 'Kernel classes'): gemm (matmuls, convolutions as implicit GEMM), attention, "
    "elementwise_norm_reduce (memory-bound: elementwise, norms, reductions, copies, embedding "
    "lookups, optimizers), other. Mean per step over the measured steps that carry a split.",
    "utilization": "MFU = model FLOPs / (peak FLOP/s × step time); HFU adds the recomputed "
    "FLOPs of activation checkpointing. Job-level per step: ratio of sums over ranks. Shaded: "
    "the profiled windows, the only steps whose breakdown was measured.",
    "bandwidth": "nccl-tests definitions: algbw = S / t, busbw = algbw × factor (2(n−1)/n "
    "all_reduce; (n−1)/n all_gather, reduce_scatter, all_to_all; 1 otherwise). Dotted: the "
    "tier's unidirectional spec. Dashed: the fitted alpha-beta model t = α + S·factor / β.",
    "stragglers": "Synchronous ranks share one wall time (the fast wait for the slow inside "
    "collectives), so the slow rank shows in its own time (wall - exposed communication - "
    "pipeline bubble), which counts a slow data loader's idle time too. Straggler ratio: the "
    "rank's median over its last step reports / the median over ranks, as the collector's "
    f"mfuscope_straggler_ratio; a rank is named a straggler above ×{STRAGGLER_MIN_RATIO:.2f}, "
    "the alert's threshold.",
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
    measured = content.coverage
    cards = [
        (
            "MFU",
            _pct(content.overall[0] if content.overall else None),
            f"all {run.step_reports} rank-steps",
        ),
        ("HFU", _pct(content.overall[1] if content.overall else None), "incl. recompute"),
        ("mean step", _ms(content.mean_step_s), f"{run.step_count} steps"),
        (
            "breakdowns measured",
            f"{measured.measured} rank-steps",
            f"{measured.windows} window{'s' * (measured.windows != 1)}; {measured.carried} carried",
        ),
        ("exposed comm", _pct(fractions["exposed_comm"]), "measured steps, rank mean"),
        ("bubble", _pct(bubble), "pipeline + idle, measured"),
        ("recompute", _pct(fractions["recompute"]), "measured steps"),
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
        return _table(["rank", "measured steps", "mean step", *labels], rows)
    if plot == "waterfall" and content.waterfall:
        w = content.waterfall
        slices = [[s.label, _pct(s.fraction)] for s in w.slices] + [["MFU", _pct(w.mfu)]]
        overall = _pct(content.overall[0]) if content.overall else "–"
        sampled = content.coverage.carried + content.coverage.without > 0
        return _table(["slice", "share of peak"], slices) + (
            f'<p class="note">Over {w.samples} measured (rank, step) samples of the profiled '
            f"windows: MFU {_pct(w.mfu)}, HFU {_pct(w.hfu)}. The headline MFU ({overall}) covers "
            f"all {content.run.step_reports} rank-steps"
            + (
                "; steps under the profiler run slower (markedly on a CPU), so the measured "
                "steps' MFU is usually the lower.</p>"
                if sampled
                else ".</p>"
            )
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
        return _straggler_table(content)
    return ""


def _straggler_verdict(content: ReportContent) -> str:
    """Who is named a straggler (above the threshold), else the slowest rank and its ratio."""
    view = content.stragglers
    basis = "own time" if view.basis == "self" else "step wall time"
    if view.named:
        names = ", ".join(f"rank {s.rank} (×{s.ratio:.3f})" for s in view.named)
        return f"Stragglers: {names}, by {basis}."
    slow = view.slowest
    tail = (
        f"; the slowest is rank {slow.rank} at ×{slow.ratio:.3f} the median {basis}" if slow else ""
    )
    return f"No straggler (no rank above ×{STRAGGLER_MIN_RATIO:.2f}){tail}."


def _straggler_table(content: ReportContent) -> str:
    view = content.stragglers
    basis = "own time" if view.basis == "self" else "wall time"
    rows = [
        [
            f"rank {p.rank}",
            _ms(p.median_step_s),
            _ms(p.median_own_s),
            f"{_ms(p.straggler_step_s)} ({p.recent_steps})",
            f"{p.ratio:.3f}",
        ]
        for p in view.ranks
    ]
    header = [
        "rank",
        "median step (run)",
        "median own time (run)",
        f"median {basis} (last reports)",
        "straggler ratio",
    ]
    return _table(header, rows) + f'<p class="note">{_e(_straggler_verdict(content))}</p>'


def _coverage_note(content: ReportContent) -> str:
    launches = content.run.launches
    restarts = (
        f" The job was launched {launches.restarts + 1} times: "
        f"{launches.rerun_steps} of the {launches.step_reports} step reports re-ran steps an "
        "earlier launch had reported (redone work)."
        if launches.restarts
        else ""
    )
    return (
        f'<p class="note">Breakdowns: {_e(content.coverage.describe())}. Averages of the buckets '
        f"use the measured steps only; MFU and HFU use every step.{_e(restarts)}</p>"
    )


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
                _pct(busbw_efficiency(p.busbw_bytes_per_s, spec_of.get(p.axis))),
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
    coverage_of = {c.rank: c for c in content.coverage.ranks}
    for r in content.run.ranks:
        h, cov = r.health, coverage_of[r.rank]
        rows.append(
            [
                f"rank {r.rank}",
                r.host,
                r.device,
                _si(r.peak_flops, "FLOP/s"),
                r.peak_source,
                len(r.steps),
                cov.measured,
                cov.carried,
                cov.windows,
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
        "measured",
        "carried",
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


def _launches(run: RunData) -> str:
    launches = run.launches
    if not launches.restarts:
        return ""
    restarts = f"{launches.restarts} restart" + "s" * (launches.restarts != 1)
    return f"{restarts}, {launches.rerun_steps} re-run step reports · "


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
        f"{run.step_count} steps ({run.step_reports} rank-steps) · {_e(_launches(run))}"
        f"{_e(devices)} · generated {_e(generated)}</p>",
        "<nav>"
        + "".join(f'<a href="#plot-{p}">{_e(_TITLES[p])}</a>' for p in PLOT_NAMES)
        + "</nav>",
        _cards(content),
        _coverage_note(content),
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
