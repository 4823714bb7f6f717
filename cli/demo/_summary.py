"""The end of `mfuscope demo`: write the report from the agents' output and print a summary.

The summary tells one story: the run's MFU over every step (the headline, from the agents'
reports) against the peak, said once, then what the step breakdowns cover (profiled windows:
measured steps, and the steps that carry a window's breakdown), the buckets and waterfall of the
measured steps (the waterfall's MFU is theirs, next to the run's), and the straggler ratio, the
same value the collector exports. The collector's live gauges come after, labelled as covering
each rank's last steps only. When the previous demo run in the same output directory used another
peak, it says so: the two runs' MFUs are then against different peaks. `summary.json` keeps the
collector's `/v1/summary` document as it was, plus an ``agent_output`` section with the same
figures as the terminal (`agent_output_section`).
"""

from __future__ import annotations

import json
import shutil
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mfuscope.cli.demo._live_view import DemoState

__all__ = [
    "DemoReport",
    "agent_output_section",
    "cli_command",
    "peak_change",
    "previous_peaks",
    "print_summary",
    "save_summary",
    "write_demo_report",
]

Peaks = tuple[tuple[float, str], ...]  # the distinct (peak FLOP/s, source) of a run's ranks


@dataclass(frozen=True)
class DemoReport:
    html: Path
    pngs: int
    content: Any  # mfuscope.cli.report.writer.ReportContent (imported lazily: matplotlib is slow)


def write_demo_report(out: Path, note: Callable[[str], None]) -> DemoReport | None:
    """Render `out/report/` from `out/agent/`; None (with a note saying why) when impossible."""
    from mfuscope.cli.report.writer import load_run, write_report
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
    return DemoReport(files.html, len(files.pngs), files.content)


def _pct(value: object) -> str:
    return f"{value:.1%}" if isinstance(value, (int, float)) else "unknown"


def _job_entry(document: Mapping[str, Any] | None, job: str) -> Mapping[str, Any]:
    for entry in (document or {}).get("jobs", []):
        if entry.get("job") == job:
            return dict(entry)
    return {}


def agent_output_section(content: Any) -> dict[str, Any]:
    """The figures the terminal summary prints from the agents' reports, for summary.json (base
    units, ratios 0..1)."""
    from mfuscope.core.ledger import CATEGORIES
    from mfuscope.core.stragglers import STRAGGLER_MIN_RATIO

    run, cov, view = content.run, content.coverage, content.stragglers
    waterfall = content.waterfall
    return {
        "job": run.job,
        "steps": run.step_count,
        "step_reports": run.step_reports,
        "restarts": run.launches.restarts,
        "rerun_steps": run.launches.rerun_steps,
        "mfu": content.overall[0] if content.overall else None,
        "hfu": content.overall[1] if content.overall else None,
        "mfu_covers": "every step report",
        "peaks": [
            {"peak_flops": peak, "source": source}
            for peak, source in sorted(
                {(r.peak_flops, r.peak_source) for r in run.ranks if r.peak_flops}
            )
        ],
        "effective_mfu": run.job_time.effective_mfu,
        "effective_mfu_covers": "every rank-second, from each process's start to its exit",
        "job_time_s": dict(zip(CATEGORIES, run.job_time.seconds, strict=True)),
        "breakdowns": {
            "windows": cov.windows,
            "measured_steps": cov.measured,
            "carried_steps": cov.carried,
            "steps_without": cov.without,
            "oldest_carried_steps": cov.oldest_carried_steps,
            "oldest_carried_s": cov.oldest_carried_s,
        },
        "waterfall_mfu": waterfall.mfu if waterfall else None,
        "waterfall_covers": f"{waterfall.samples if waterfall else 0} measured step reports",
        "stragglers": {
            "basis": view.basis,
            "window_reports": max((p.recent_steps for p in view.ranks), default=0),
            "threshold": STRAGGLER_MIN_RATIO,
            "ratios": [{"rank": s.rank, "ratio": s.ratio} for s in view.stragglers],
            "named": [s.rank for s in view.named],
        },
    }


def cli_command(argv0: str | None = None, which: Any = shutil.which) -> str:
    """How to run mfuscope the way this process was run, for messages that name a command:
    ``mfuscope`` when that is on PATH (an installed wheel), else the path this process was
    started as (from a checkout: ``.venv/bin/mfuscope``, as ``./dev`` runs it)."""
    started = Path(sys.argv[0] if argv0 is None else argv0)
    if started.name != "mfuscope":
        return "mfuscope"
    on_path = which("mfuscope")
    if on_path is not None and Path(on_path).resolve() == started.resolve():
        return "mfuscope"
    try:
        return str(started.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(started.resolve())


def previous_peaks(out: Path) -> Peaks:
    """The peaks of the demo run that last wrote `out/summary.json` (read before a new run clears
    it); empty when there is none or it says nothing of its peaks."""
    try:
        saved = json.loads((out / "summary.json").read_text())
        return tuple(
            (float(p["peak_flops"]), str(p["source"])) for p in saved["agent_output"]["peaks"]
        )
    except (OSError, ValueError, KeyError, TypeError):
        return ()


def peak_change(previous: Peaks, content: Any) -> str | None:
    """A line when this run's peaks differ from the previous run's (by more than 0.1%)."""
    current = tuple(
        sorted({(r.peak_flops, r.peak_source) for r in content.run.ranks if r.peak_flops})
    )
    if not previous or not current:
        return None
    if len(previous) == len(current) and all(
        abs(a - b) <= 1e-3 * max(a, b) for (a, _), (b, _) in zip(previous, current, strict=True)
    ):
        return None

    def words(peaks: Peaks) -> str:
        return ", ".join(f"{p / 1e9:.4g} GFLOP/s ({source})" for p, source in peaks)

    return (
        f"peak changed: the previous demo run here used {words(previous)}, this one "
        f"{words(current)}; the two runs' MFUs are against different peaks (compare their step "
        f"times, or `{cli_command()} calc --calibrate` to measure the CPU peak again for both)"
    )


def save_summary(out: Path, document: Mapping[str, Any] | None, report: DemoReport | None) -> None:
    """Write summary.json: the collector's document, plus `agent_output` when there is a report."""
    if document is None:
        return
    saved = dict(document)
    if report is not None:
        saved["agent_output"] = agent_output_section(report.content)
    (out / "summary.json").write_text(json.dumps(saved, indent=2) + "\n")


def print_summary(
    state: DemoState,
    document: Mapping[str, Any] | None,
    report: DemoReport | None,
    out: Path,
    elapsed_s: float,
    previous: Peaks = (),
) -> None:
    """Print what the demo measured and where its output is; `previous`: the peaks of the demo run
    this one replaced in `out` (`previous_peaks`)."""
    job = _job_entry(document, state.job)
    steps = state.steps_done if state.steps_done is not None else state.steps_target
    loss = "" if state.loss is None else f"; final loss {state.loss:.3f}"
    if state.loss is not None and state.loss_floor is not None:
        loss += f" (floor {state.loss_floor:.3f})"
    lines = [f"mfuscope demo: done in {elapsed_s:.0f} s: {steps} steps, {state.mode}{loss}"]
    if report is not None:
        from mfuscope.cli.report.summary import describe_run

        lines += ["  " + line for line in describe_run(report.content)]
        changed = peak_change(previous, report.content)
        if changed is not None:
            lines.append("    " + changed)
    if job:
        reports = job.get("reports") or {}
        rejected = sum((document or {}).get("rejected", {}).values())
        lines.append(
            f"  at the collector: MFU {_pct(job.get('mfu'))}  HFU {_pct(job.get('hfu'))} over "
            f"each rank's last {job.get('window_steps')} steps (its live gauges: the end of the "
            "run, where the run's MFU above covers every step), effective MFU "
            f"{_pct(job.get('effective_mfu'))} over every rank-second; "
            f"{reports.get('accepted', 0)} step reports from {job.get('ranks', 0)} of "
            f"{job.get('world_size', 0)} ranks ({reports.get('duplicates', 0)} duplicates, "
            f"{reports.get('dropped_by_agents', 0)} dropped by agents, {rejected} batches "
            "rejected)"
        )
    lines.append(f"  output in {out}/:")
    if report is not None:
        lines.append(f"    report        {report.html} ({report.pngs} PNG plots beside it)")
    lines.append(f"    agent output  {out / 'agent'}/ (JSONL, one batch per line, per rank)")
    lines.append(
        "    collector     summary.json (with the figures above under agent_output), "
        "metrics.txt; logs: train.log, collector.log"
    )
    print("\n".join(lines), flush=True)
