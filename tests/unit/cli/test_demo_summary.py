"""The demo's closing summary tells one MFU story: the run's MFU over every step against the peak
said once, the waterfall's MFU as the profiled steps' own next to the run's, the collector's live
gauges as the last steps only; and a line when the previous demo run used another peak."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from mfuscope.cli.demo._live_view import DemoState
from mfuscope.cli.demo._summary import (
    DemoReport,
    agent_output_section,
    cli_command,
    peak_change,
    previous_peaks,
    print_summary,
    save_summary,
)
from mfuscope.cli.report._content import build_content
from mfuscope.cli.report._load import load_run
from mfuscope.core.schema import ComponentShare, ReportBatch, StepReport, encode_batch


def _step(step: int) -> StepReport:
    measured = 2 <= step <= 4  # a profiled window; later steps carry its breakdown
    parts = (
        ComponentShare("compute", 0.05),
        ComponentShare("instrumentation", 0.03 if measured else 0.0),
        ComponentShare("bubble_idle", 0.02 if measured else 0.05),
    )
    return StepReport(
        step=step,
        start_unix_ns=1_700_000_000_000_000_000 + step * 100_000_000,
        wall_s=0.1,
        model_flops=2e9,
        recompute_flops=2e8,
        components=parts if step >= 2 else (),
        breakdown_step=None if step < 2 else min(step, 4),
    )


def _content(tmp_path: Path, peaks: tuple[float, float] = (1e11, 1e11)) -> Any:
    directory = tmp_path / "agent"
    directory.mkdir(exist_ok=True)
    for rank, peak in enumerate(peaks):
        batch = ReportBatch(
            job="demo",
            rank=rank,
            world_size=2,
            host="node-0",
            device="cpu",
            peak_flops=peak,
            peak_source="measured",
            sent_unix_ns=0,
            reports=tuple(_step(s) for s in range(12)),
        )
        (directory / f"rank{rank}.jsonl").write_text(encode_batch(batch).decode() + "\n")
    return build_content(load_run([directory]).run)


COLLECTOR = {
    "jobs": [
        {
            "job": "demo",
            "mfu": 0.21,
            "hfu": 0.23,
            "window_steps": 20,
            "ranks": 2,
            "world_size": 2,
            "reports": {"accepted": 24, "duplicates": 0, "dropped_by_agents": 0},
        }
    ],
    "rejected": {},
}


def _printed(
    tmp_path: Path, content: Any, capsys: pytest.CaptureFixture[str], previous: Any = ()
) -> str:
    state = DemoState(job="demo", mode="data parallel (dp), 2 ranks, gloo", steps_target=12)
    report = DemoReport(tmp_path / "report" / "report.html", 5, content)
    print_summary(state, COLLECTOR, report, tmp_path, 60.0, previous)
    return capsys.readouterr().out


def test_each_mfu_says_what_it_covers_and_the_peak_is_said_once(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    text = _printed(tmp_path, _content(tmp_path), capsys)
    mfus = re.findall(r"MFU (\d+\.\d)%", text)
    # the run (2e9 FLOP / (1e11 FLOP/s x 0.1 s)), the waterfall, the collector
    assert mfus == ["20.0", "20.0", "21.0"], text
    assert "over all 24 rank-steps (the run's MFU; HFU adds recomputation)" in text
    assert "(these profiled steps' own MFU, instrumentation included; the run's is 20.0%)" in text
    assert "over each rank's last 20 steps (its live gauges: the end of the run" in text
    assert text.count("GFLOP/s") == 1 and "peak 100 GFLOP/s per rank (measured)" in text
    assert "peak changed" not in text


def test_ranks_with_different_peaks_are_named(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    text = _printed(tmp_path, _content(tmp_path, (1e11, 1.05e11)), capsys)
    assert (
        "peaks differ between ranks: 100 GFLOP/s (measured) on rank 0; 105 GFLOP/s (measured) "
        "on rank 1 (each rank's MFU is against its own)"
    ) in text


def test_a_previous_run_with_another_peak_is_said(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # The previous run's summary.json gives its peaks; this run used another.
    earlier = _content(tmp_path, (8.5e10, 8.5e10))
    save_summary(tmp_path, COLLECTOR, DemoReport(tmp_path / "r.html", 0, earlier))
    previous = previous_peaks(tmp_path)
    assert previous == ((8.5e10, "measured"),)
    assert agent_output_section(earlier)["peaks"] == [{"peak_flops": 8.5e10, "source": "measured"}]
    text = _printed(tmp_path, _content(tmp_path), capsys, previous)
    assert (
        "peak changed: the previous demo run here used 85 GFLOP/s (measured), this one 100 GFLOP/s "
        "(measured); the two runs' MFUs are against different peaks"
    ) in text
    # The same peak (to 0.1%) as before, or no earlier run: nothing to say.
    same = _content(tmp_path)
    assert peak_change(((1.0005e11, "measured"),), same) is None
    assert peak_change((), same) is None
    assert previous_peaks(tmp_path / "absent") == ()


def test_commands_are_named_the_way_this_process_was_run(tmp_path: Path) -> None:
    installed = tmp_path / "bin" / "mfuscope"
    installed.parent.mkdir()
    installed.write_text("")
    # A wheel's console script on PATH: plain `mfuscope`.
    assert cli_command(str(installed), which=lambda name: str(installed)) == "mfuscope"
    # A checkout's `.venv/bin/mfuscope` (how `./dev` runs it), not on PATH: that path.
    assert cli_command(str(installed), which=lambda name: None) == str(installed.resolve())
    # `python -m mfuscope.cli ...`: the command users know.
    assert cli_command("/x/mfuscope/cli/__main__.py", which=lambda name: None) == "mfuscope"
