"""`mfuscope report` end to end: agent JSONL or real Kineto traces in, one offline HTML page out."""

from __future__ import annotations

import re
from pathlib import Path

import msgspec
import pytest
from mfuscope.cli import main
from mfuscope.cli.report.writer import PLOT_NAMES
from mfuscope.core.schema import (
    AgentHealth,
    ClassShare,
    CollectiveSample,
    ComponentShare,
    GroupInfo,
    ReportBatch,
    StepReport,
    Topology,
    encode_batch,
)

from tests.support.shared_data import A100_TRACE, require

pytestmark = pytest.mark.slow  # end to end over real traces (the integration folder)

ROOT = Path(__file__).resolve().parents[2]
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
# The only URLs an offline page may hold: XML namespace names inside the inline SVG (never fetched).
NAMESPACES = {"http://www.w3.org/2000/svg", "http://www.w3.org/1999/xlink"}


def _step(step: int, rank: int) -> StepReport:
    wall = 0.1 * (1.2 if rank == 1 else 1.0)
    compute = 0.06 * (1.2 if rank == 1 else 1.0)
    parts = [
        ComponentShare("compute", compute),
        ComponentShare("recompute", 0.01),
        ComponentShare("exposed_comm", 0.02, axis="dp", tier="intra_node"),
        ComponentShare("bubble_idle", wall - compute - 0.03),
    ]
    collectives = tuple(
        CollectiveSample(
            op="all_reduce",
            axis="dp",
            tier="intra_node",
            group_size=2,
            bytes=size,
            count=2,
            seconds=2 * (2e-5 + size / 1e10),
            overlapped_s=0.0,
        )
        for size in (4, 1 << 16, 1 << 20, 1 << 24)
    )
    return StepReport(
        step=step,
        start_unix_ns=1_700_000_000_000_000_000 + step * 100_000_000,
        wall_s=wall,
        model_flops=2e9,
        recompute_flops=2e8,
        components=tuple(parts) if step >= 2 else (),
        collectives=collectives if step in (2, 3, 4) else (),
        # Steps 2-4 are a profiled window; later steps carry its last step's breakdown.
        breakdown_step=None if step < 2 else min(step, 4),
        compute_classes=(
            ClassShare("gemm", 0.6 * compute),
            ClassShare("elementwise_norm_reduce", 0.4 * compute),
        )
        if step >= 2
        else (),
    )


def _plain_step(step: int, rank: int) -> StepReport:
    """`_step` without a breakdown, collectives or kernel classes: wall time and FLOPs only."""
    return msgspec.structs.replace(
        _step(step, rank), components=(), collectives=(), compute_classes=(), breakdown_step=None
    )


def _write_agent_output(directory: Path, steps: int = 12) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    topology = Topology((GroupInfo("dp", "intra_node", 2, False, 3.15e10),))
    for rank in range(2):
        lines = []
        for first in range(0, steps, 4):
            batch = ReportBatch(
                job="synthetic",
                rank=rank,
                world_size=2,
                host="node-0",
                device="cpu",
                peak_flops=1e11,
                peak_source="measured",
                sent_unix_ns=first,
                reports=tuple(_step(s, rank) for s in range(first, min(first + 4, steps))),
                health=AgentHealth(windows_analysed_total=1),
                topology=topology,
            )
            lines.append(encode_batch(batch).decode())
        (directory / f"rank{rank}.jsonl").write_text("\n".join(lines) + "\n")


def _assert_offline_page(html: str, plots: tuple[str, ...]) -> None:
    for plot in plots:
        figure = re.search(rf'<figure id="plot-{plot}">(.*?)</figure>', html, re.DOTALL)
        assert figure is not None, plot
        assert figure.group(1).lstrip().startswith("<svg"), plot
    lowered = html.lower()
    for forbidden in ("<script", "<link", "<iframe", "@import", " src=", "url(http"):
        assert forbidden not in lowered, forbidden
    assert set(re.findall(r"https?://[^\s\"'<>)]+", html)) <= NAMESPACES


def test_report_from_agent_jsonl(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    agent_dir = tmp_path / "agent"
    _write_agent_output(agent_dir, steps=24)
    # A killed job leaves a truncated last line: skipped with a warning, the rest is reported.
    with (agent_dir / "rank1.jsonl").open("a") as stream:
        stream.write('{"schema": "mfuscope.report", "vers')
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    assert main(["report", str(agent_dir)]) == 0
    out, err = capsys.readouterr()
    assert "rank1.jsonl:7: skipped" in err
    assert "2 of 2 ranks, 24 steps (48 rank-steps)" in out
    # The output goes to the current directory, never into the inputs, and says where.
    report_dir = work / "mfuscope-report"
    assert sorted(p.name for p in agent_dir.iterdir()) == ["rank0.jsonl", "rank1.jsonl"]
    assert f"wrote {report_dir / 'report.html'}" in out
    # Every figure says what it covers: all steps for MFU, the measured ones for the buckets.
    assert "over all 48 rank-steps" in out
    assert (
        "breakdowns: 1 profiled window measured 3 steps per rank, 6 rank-steps; 38 rank-steps "
        "carry an earlier window's breakdown (up to 19 steps, 2 s old); 4 rank-steps have none"
    ) in out
    assert "waterfall (6 measured rank-steps): MFU 18.2%" in out
    assert "stragglers: none above ×1.20; slowest rank 1 at ×1.111" in out
    html = (report_dir / "report.html").read_text()
    _assert_offline_page(html, PLOT_NAMES)
    for plot in PLOT_NAMES:
        assert (report_dir / f"{plot}.png").read_bytes().startswith(PNG_MAGIC), plot
        assert f'href="{plot}.png"' in html
    # The known inputs show through. MFU = 24 x 2e9 FLOP / (1e11 FLOP/s x 12 x (0.1 + 0.12) s);
    # own time (wall - exposed comm) 0.08 s vs 0.10 s: rank 1 at 0.10 / median(0.08, 0.10) = 1.111.
    assert "<b>18.2%</b>" in html
    # The unfused kernels apart in the waterfall: 0.4 x (0.06 + 0.072) s over 0.22 s of wall.
    assert "<td>unfused kernels</td><td>24.0%</td>" in html
    # The class view averages the 3 measured steps (2-4) of rank 1, not the 7 that carry them.
    assert "<td>rank 1</td><td>3</td><td>72.00 ms</td><td>60.0%</td>" in html
    assert "<td>1.111</td>" in html
    assert "No straggler (no rank above ×1.20); the slowest is rank 1 at ×1.111" in html
    assert "6 measured (rank, step) samples" in html
    assert "Fit over 4 sizes" in html
    assert not list(report_dir.glob(".*.tmp"))


def test_report_rejects_bad_input_with_one_clear_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = tmp_path / "nowhere"
    assert main(["report", str(missing)]) == 2
    assert f"{missing}: no such file or directory" in capsys.readouterr().err
    empty = tmp_path / "empty"
    empty.mkdir()
    assert main(["report", str(empty)]) == 2
    assert "no agent output (*.jsonl) or traces" in capsys.readouterr().err
    garbage = tmp_path / "garbage"
    garbage.mkdir()
    (garbage / "rank0.jsonl").write_text("not json\n")
    assert main(["report", str(garbage)]) == 2
    assert f"no valid agent batch in {garbage / 'rank0.jsonl'}" in capsys.readouterr().err
    assert not (empty / "mfuscope-report").exists() and not (garbage / "mfuscope-report").exists()


def test_report_from_a_real_gpu_trace(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace = require(A100_TRACE)
    args = ["report", str(trace), "--out", str(tmp_path / "r"), "--no-png"]
    # Without FLOPs the MFU plots say why they are missing; the rest is drawn from the trace.
    assert main(args) == 0
    assert "waterfall: not drawn (model FLOPs are unknown" in capsys.readouterr().out
    html = (tmp_path / "r" / "report.html").read_text()
    _assert_offline_page(html, ("decomposition", "bandwidth", "stragglers"))
    assert '<figure id="plot-waterfall"><p class="missing">' in html
    assert "A100" in html and "all_reduce" in html
    assert not list((tmp_path / "r").glob("*.png"))
    # With FLOPs and a peak every plot is drawn.
    flops = ["--model-flops-per-step", "3e12", "--peak-flops", "312e12"]
    assert main(args + flops) == 0
    _assert_offline_page((tmp_path / "r" / "report.html").read_text(), PLOT_NAMES)


def test_report_counts_launches_as_the_collector_does(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Launch "a" runs steps 0-11 and re-sends one batch; launch "b" resumes at step 6. Steps
    # without a breakdown: counting is what is checked, and the four breakdown plots (drawn in
    # test_report_from_agent_jsonl) were most of this test's time.
    lines = []
    for incarnation, first, last, sent in (("a", 0, 12, 0), ("a", 8, 12, 50), ("b", 6, 12, 100)):
        for rank in range(2):
            batch = ReportBatch(
                job="restarted",
                rank=rank,
                world_size=2,
                host="node-0",
                device="cpu",
                peak_flops=1e11,
                peak_source="measured",
                sent_unix_ns=sent,
                reports=tuple(_plain_step(s, rank) for s in range(first, last)),
                incarnation=incarnation,
            )
            lines.append(encode_batch(batch).decode())
    (tmp_path / "agent.jsonl").write_text("\n".join(lines) + "\n")
    out_dir = tmp_path / "out"
    assert main(["report", str(tmp_path / "agent.jsonl"), "--out", str(out_dir), "--no-png"]) == 0
    out = capsys.readouterr().out
    assert "12 steps (36 rank-steps)" in out
    assert "launches: 2 (1 restart); 12 of the 36 rank-steps re-ran steps" in out
    html = (out_dir / "report.html").read_text()
    assert "1 restart, 12 re-run step reports" in html


def test_report_names_the_files_of_a_rank_given_twice(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = ROOT / "tests" / "data" / "gloo-ddp-2rank" / "rank0.json.gz"
    copy = tmp_path / "again.json.gz"
    copy.write_bytes(trace.read_bytes())
    assert main(["report", str(trace), str(copy), "--out", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err
    assert f"several traces of rank 0: {trace}, {copy}" in err
    assert not (tmp_path / "r").exists()
