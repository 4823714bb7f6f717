"""The demo's live terminal view, drawn from the collector's ``GET /v1/summary`` digest.

`DemoState` is what the demo knows (its phase, the job's progress lines, the latest summary of the
job); `render` turns it into a rich renderable and `status_line` into one plain line for
non-interactive output. Both are functions of the state only, so they are tested without a
terminal, a collector or a clock.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from mfuscope.cli.demo._agent_tail import BreakdownStatus
from mfuscope.core.stragglers import STRAGGLER_MIN_RATIO, is_straggler
from mfuscope.core.vocabulary import COMPONENTS, SLICE_TITLES
from rich.columns import Columns
from rich.console import Group, RenderableType
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

__all__ = [
    "BUCKET_STYLES",
    "DemoState",
    "breakdown_line",
    "decomposition_bar",
    "job_time_text",
    "render",
    "status_line",
    "straggler_text",
]

_STYLES = {
    "compute": "blue",
    "recompute": "magenta",
    "exposed_comm": "red",
    "other": "yellow",
    "bubble_pipeline": "dark_orange",
    "bubble_idle": "grey50",
    "instrumentation": "cyan",
}
# (summary component key, label, style) of every bucket, in the vocabulary's order
# (docs/definitions.md#step-buckets); a bucket without a colour of its own is drawn white.
BUCKET_STYLES: tuple[tuple[str, str, str], ...] = tuple(
    (c, SLICE_TITLES[c], _STYLES.get(c, "white")) for c in COMPONENTS
)


@dataclass
class DemoState:
    """Everything the view shows. The demo updates it; the view only reads it."""

    job: str
    mode: str  # e.g. "data parallel over 2 ranks"
    steps_target: int | None  # None: the job trains for `duration_s`
    duration_s: float | None = None
    steps_done: int | None = None
    metrics_url: str | None = None
    prometheus_url: str | None = None
    phase: str = "starting"
    elapsed_s: float = 0.0
    step: int | None = None
    loss: float | None = None
    loss_floor: float | None = None
    summary: Mapping[str, Any] | None = None  # this job's entry of /v1/summary
    breakdowns: BreakdownStatus | None = None  # what the agents' breakdowns cover so far
    notes: list[str] = field(default_factory=list)  # progress so far, oldest first


def _pct(value: object) -> str:
    return f"{value:.1%}" if isinstance(value, (int, float)) else "–"


def _si(value: object, unit: str) -> str:
    if not isinstance(value, (int, float)):
        return "–"
    for factor, prefix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= factor:
            return f"{value / factor:.3g} {prefix}{unit}"
    return f"{value:.3g} {unit}"


def decomposition_bar(components: Mapping[str, float], width: int = 48) -> Text:
    """A bar of `width` cells split by bucket fraction (largest remainders keep the total)."""
    fractions = [
        (key, style, max(float(components.get(key, 0.0)), 0.0)) for key, _, style in BUCKET_STYLES
    ]
    total = sum(f for _, _, f in fractions)
    bar = Text()
    if total <= 0:
        return bar.append("·" * width, style="grey35")
    exact = [f / total * width for _, _, f in fractions]
    cells = [int(x) for x in exact]
    by_remainder = sorted(range(len(exact)), key=lambda i: exact[i] - cells[i], reverse=True)
    for i in by_remainder[: width - sum(cells)]:
        cells[i] += 1
    for (_, style, _), count in zip(fractions, cells, strict=True):
        bar.append("█" * count, style=style)
    return bar


def _progress(state: DemoState) -> str:
    target = f"/{state.steps_target}" if state.steps_target else ""
    step = "–" if state.step is None else f"{state.step + 1}{target}"
    if state.duration_s is not None:
        step += f" (training ~{state.duration_s:.0f} s)"
    loss = "" if state.loss is None else f"  loss {state.loss:.3f}"
    if state.loss is not None and state.loss_floor is not None:
        loss += f" (floor {state.loss_floor:.3f})"
    return f"{state.phase} · step {step}{loss} · {state.elapsed_s:.0f} s"


def breakdown_line(status: BreakdownStatus | None) -> str:
    """Which window the breakdown is from, how old it is, and measured vs carried steps."""
    if status is None or status.latest_window_step is None:
        return "no profiled window measured yet"
    cov = status.coverage
    age = f"{status.window_age_steps} steps"
    if status.window_age_s is not None:
        age += f" / {status.window_age_s:.1f} s"
    return (
        f"latest window at step {status.latest_window_step} ({age} ago); {cov.windows} "
        f"window{'s' * (cov.windows != 1)} measured {cov.measured} rank-steps, "
        f"{cov.carried} carry a window's breakdown"
    )


def straggler_text(job: Mapping[str, Any]) -> str:
    """The collector's straggler ratios, naming a rank a straggler only above the threshold."""
    stragglers = job.get("stragglers") or []
    basis = job.get("straggler_basis")
    over = f"{'own' if basis == 'self' else 'wall'} time, last {job.get('window_steps')} steps"
    named = [s for s in stragglers if is_straggler(float(s.get("ratio", 0.0)))]
    if named:
        names = ", ".join(f"rank {s.get('rank')} ×{s.get('ratio', 0.0):.2f}" for s in named)
        return f"{names} ({over})"
    if not stragglers:
        return "–"
    slow = stragglers[0]
    return (
        f"none above ×{STRAGGLER_MIN_RATIO:.2f} (slowest rank {slow.get('rank')} "
        f"×{slow.get('ratio', 0.0):.2f}, {over})"
    )


def job_time_text(seconds: Mapping[str, float]) -> str:
    """Where the ranks' time went so far (the job-time ledger's largest shares)."""
    total = sum(seconds.values())
    if not total > 0:
        return "every rank-second of the job, startup included (none booked yet)"
    top = sorted(((s / total, c) for c, s in seconds.items() if s > 0), reverse=True)[:4]
    return "of every rank-second: " + ", ".join(f"{c} {_pct(share)}" for share, c in top)


def status_line(state: DemoState) -> str:
    """One plain line: progress, MFU/HFU, the buckets and the reports (for --no-live)."""
    parts = [_progress(state)]
    job = state.summary
    if job:
        parts.append(
            f"MFU {_pct(job.get('mfu'))} HFU {_pct(job.get('hfu'))} "
            f"effective MFU {_pct(job.get('effective_mfu'))}"
        )
        components = job.get("components") or {}
        if components:
            parts.append(
                " ".join(
                    f"{label} {_pct(components.get(key, 0.0))}"
                    for key, label, _ in BUCKET_STYLES
                    if components.get(key)
                )
                + f" ({breakdown_line(state.breakdowns)})"
            )
        reports = job.get("reports") or {}
        parts.append(
            f"reports {reports.get('accepted', 0)} from {job.get('ranks', 0)}/"
            f"{job.get('world_size', 0)} ranks, dropped {reports.get('dropped_by_agents', 0)}"
        )
    return " | ".join(parts)


def _headline(state: DemoState) -> Table:
    job = state.summary or {}
    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="bold")
    grid.add_column()
    grid.add_row("progress", _progress(state))
    grid.add_row("/metrics", state.metrics_url or "starting…")
    if state.prometheus_url:
        grid.add_row("prometheus", state.prometheus_url)
    peak = job.get("peak_flops")
    unknown = job.get("peak_unknown_ranks") or 0
    peak_text = f"peak {_si(peak, 'FLOP/s')} over {job.get('ranks', 0)} ranks" if peak else ""
    if unknown:
        peak_text += f", {unknown} ranks with unknown peak"
    window = job.get("window_steps")
    grid.add_row(
        "MFU / HFU",
        Text.assemble(
            (_pct(job.get("mfu")), "bold green"),
            " / ",
            (_pct(job.get("hfu")), "bold magenta"),
            f"   last {window} steps per rank; {peak_text}" if window else "",
        ),
    )
    grid.add_row(
        "effective MFU",
        Text.assemble(
            (_pct(job.get("effective_mfu")), "bold green"),
            "   " + job_time_text(job.get("job_time_s") or {}),
        ),
    )
    components = job.get("components") or {}
    legend = Text()
    for key, label, style in BUCKET_STYLES:
        if components.get(key):
            legend.append(f"■ {label} {_pct(components[key])}  ", style=style)
    grid.add_row(
        "step",
        Group(
            decomposition_bar(components),
            legend,
            Text(breakdown_line(state.breakdowns), style="grey50"),
        )
        if components
        else Text("waiting for the first profiled window…", style="grey50"),
    )
    return grid


def _tables(job: Mapping[str, Any]) -> list[RenderableType]:
    tables: list[RenderableType] = []
    exposed = job.get("exposed_comm") or []
    if exposed:
        t = Table(
            title="exposed comm by axis/tier (latest window)", title_justify="left", expand=False
        )
        for name in ("axis", "tier", "of step"):
            t.add_column(name, justify="right" if name == "of step" else "left")
        for e in exposed:
            t.add_row(str(e.get("axis")), str(e.get("tier")), _pct(e.get("fraction")))
        tables.append(t)
    collectives = job.get("collectives") or []
    if collectives:
        t = Table(title="top collectives (latest profiled steps)", title_justify="left")
        for name in ("op", "axis", "tier", "calls", "mean size", "time", "busbw", "of spec"):
            t.add_column(name, justify="left" if name in ("op", "axis", "tier") else "right")
        for c in collectives:
            calls = c.get("calls") or 0
            size = c.get("bytes") / calls if calls and c.get("bytes") is not None else None
            t.add_row(
                str(c.get("op")),
                str(c.get("axis")),
                str(c.get("tier")),
                str(calls),
                _si(size, "B"),
                f"{(c.get('seconds') or 0.0) * 1e3:.1f} ms",
                _si(c.get("busbw_bytes_per_s"), "B/s"),
                _pct(c.get("efficiency")),
            )
        tables.append(t)
    reports = job.get("reports") or {}
    health = job.get("agent_health") or {}
    t = Table(title="ranks and reports", title_justify="left", show_header=False)
    t.add_column(style="bold")
    t.add_column()
    t.add_row("ranks reporting", f"{job.get('ranks', 0)} of {job.get('world_size', 0)}")
    t.add_row(
        "reports",
        f"{reports.get('accepted', 0)} accepted, "
        f"{reports.get('duplicates', 0)} duplicates, "
        f"{reports.get('dropped_by_agents', 0)} dropped by agents, "
        f"{health.get('send_failures_total', 0)} send failures",
    )
    t.add_row("stragglers", straggler_text(job))
    tables.append(t)
    return tables


def render(state: DemoState) -> RenderableType:
    """The whole live view for `state`."""
    body: list[RenderableType] = [_headline(state)]
    if state.summary:
        body.append(Columns(_tables(state.summary), padding=(0, 2)))
    if state.notes:
        body.append(Text("\n".join(state.notes[-4:]), style="grey50"))
    return Panel(
        Group(*body),
        title=f"mfuscope demo · job {state.job} · {state.mode}",
        title_align="left",
        border_style="cyan",
    )
