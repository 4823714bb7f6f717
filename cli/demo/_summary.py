"""The end of `mfuscope demo`: write the report from the agents' output and print a summary."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mfuscope.cli.demo._live_view import BUCKET_STYLES, DemoState

__all__ = ["DemoReport", "print_summary", "write_demo_report"]


@dataclass(frozen=True)
class DemoReport:
    html: Path
    pngs: int
    content: Any  # mfuscope.cli.report.writer.ReportContent (imported lazily: matplotlib is slow)


def write_demo_report(out: Path, note: Callable[[str], None]) -> DemoReport | None:
    """Render `out/report/` from `out/agent/`; None (with a note saying why) when impossible."""
    from mfuscope.cli.report.writer import build_content, load_run, write_report
    from mfuscope.core.errors import ReportInputError

    note("writing the report…")
    try:
        loaded = load_run([out / "agent"])
    except ReportInputError as exc:
        note(f"no report: {exc}")
        return None
    for warning in loaded.warnings:
        note(f"report input: {warning}")
    generated = time.strftime("%Y-%m-%d %H:%M:%S %Z")
    files = write_report(loaded.run, out / "report", generated)
    return DemoReport(files.html, len(files.pngs), build_content(loaded.run))


def _pct(value: object) -> str:
    return f"{value:.1%}" if isinstance(value, (int, float)) else "unknown"


def _job_entry(document: Mapping[str, Any] | None, job: str) -> Mapping[str, Any]:
    for entry in (document or {}).get("jobs", []):
        if entry.get("job") == job:
            return dict(entry)
    return {}


def print_summary(
    state: DemoState,
    document: Mapping[str, Any] | None,
    report: DemoReport | None,
    out: Path,
    elapsed_s: float,
) -> None:
    """Print what the demo measured and where its output is."""
    job = _job_entry(document, state.job)
    steps = state.steps_done if state.steps_done is not None else state.steps_target
    loss = "" if state.loss is None else f"; final loss {state.loss:.3f}"
    if state.loss is not None and state.loss_floor is not None:
        loss += f" (floor {state.loss_floor:.3f})"
    lines = [f"mfuscope demo: done in {elapsed_s:.0f} s: {steps} steps, {state.mode}{loss}"]
    content = report.content if report else None
    if content is not None and content.overall is not None:
        ranks = content.run.ranks
        peaks = sorted({(r.peak_flops, r.peak_source) for r in ranks if r.peak_flops})
        peak = ", ".join(f"{p / 1e9:.1f} GFLOP/s ({source})" for p, source in peaks)
        lines.append(
            f"  MFU {_pct(content.overall[0])}  HFU {_pct(content.overall[1])}  "
            f"whole run, from the agents' reports (peak per rank: {peak or 'unknown'})"
        )
    if job:
        lines.append(
            f"  MFU {_pct(job.get('mfu'))}  HFU {_pct(job.get('hfu'))}  at the collector, "
            f"last {job.get('window_steps')} steps per rank"
        )
    if content is not None and content.decomposition:
        n = len(content.decomposition)
        shares = {
            key: sum(r.fraction(key) for r in content.decomposition) / n
            for key, _, _ in BUCKET_STYLES
        }
        profiled = sum(r.steps for r in content.decomposition)
        lines.append(
            "  step: "
            + " · ".join(f"{label} {_pct(shares[key])}" for key, label, _ in BUCKET_STYLES)
            + f"  (mean over ranks; {profiled} rank-steps decomposed)"
        )
    for entry in job.get("exposed_comm") or []:
        lines.append(
            f"  exposed comm {entry.get('axis')}/{entry.get('tier')}: "
            f"{_pct(entry.get('fraction'))} of the step (latest window)"
        )
    if job:
        reports = job.get("reports") or {}
        rejected = sum((document or {}).get("rejected", {}).values())
        lines.append(
            f"  collector: {reports.get('accepted', 0)} step reports from "
            f"{job.get('ranks', 0)} of {job.get('world_size', 0)} ranks "
            f"({reports.get('duplicates', 0)} duplicates, "
            f"{reports.get('dropped_by_agents', 0)} dropped by agents, "
            f"{rejected} batches rejected)"
        )
    if content is not None and content.stragglers.slowest is not None:
        slow = content.stragglers.slowest
        basis = (
            f"own time ×{slow.own_ratio:.2f}"
            if slow.own_ratio is not None
            else f"step time ×{slow.step_ratio:.2f}"
        )
        lines.append(f"  slowest rank: rank {slow.rank}, {basis} the job median")
    lines.append(f"  output in {out}/:")
    if report is not None:
        lines.append(f"    report        {report.html} ({report.pngs} PNG plots beside it)")
    lines.append(f"    agent output  {out / 'agent'}/ (JSONL, one batch per line, per rank)")
    lines.append("    collector     summary.json, metrics.txt; logs: train.log, collector.log")
    print("\n".join(lines), flush=True)
