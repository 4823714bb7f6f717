"""`mfuscope compare`: traces, agent output and collector summaries side by side, and its exit
codes (0 ok, 3 regression past --max-regression, 2 bad input or nothing to compare)."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import msgspec
import pytest
from mfuscope.cli import main
from mfuscope.collector import Aggregator, StateConfig
from mfuscope.collector._summary import summary
from mfuscope.core.schema import (
    ClassShare,
    CollectiveSample,
    ComponentShare,
    LedgerTotals,
    ReportBatch,
    StepReport,
    encode_batch,
)

from tests.support.collector_fakes import FakeClock
from tests.support.shared_data import A100_TRACE, require

GLOO = Path(__file__).resolve().parents[2] / "data" / "gloo-ddp-2rank"


def _compare(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main(["compare", *args])
    out, err = capsys.readouterr()
    return code, out, err


def _json(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, dict[str, Any]]:
    code, out, _ = _compare([*args, "--json"], capsys)
    return code, json.loads(out) if out else {}


def _slowed_copy(source: Path, target: Path, factor: float) -> Path:
    """Every event of every rank's trace `factor` times as long, and as far from the start: the
    same run, uniformly slower."""
    target.mkdir()
    for path in sorted(source.glob("*.json.gz")):
        trace = json.loads(gzip.decompress(path.read_bytes()))
        events = trace["traceEvents"]
        origin = min(e["ts"] for e in events if isinstance(e.get("ts"), int | float))
        for event in events:
            if isinstance(event.get("ts"), int | float):
                event["ts"] = origin + (event["ts"] - origin) * factor
            if isinstance(event.get("dur"), int | float):
                event["dur"] = event["dur"] * factor
        # The fastest compression: only the events matter, and level 9 took ~0.2 s a trace.
        (target / path.name).write_bytes(gzip.compress(json.dumps(trace).encode(), compresslevel=1))
    return target


def test_a_trace_against_itself_has_zero_deltas(capsys: pytest.CaptureFixture[str]) -> None:
    code, doc = _json([str(GLOO), str(GLOO), "--max-regression", "0"], capsys)
    assert code == 0
    assert doc["baseline"]["kind"] == "traces" and doc["baseline"]["ranks"] == 2
    assert doc["baseline"]["rank_steps"] == 4 and doc["baseline"]["windows"] == 1
    rows = doc["headline"] + doc["slices"] + doc["stragglers"]
    assert {r["label"] for r in doc["slices"]} >= {"compute", "exposed comm world/intra_node"}
    assert all(r["delta"] == 0 for r in rows if r["delta"] is not None)
    assert doc["regression"]["metric"] == "mean_step_s" and doc["regression"]["worse_by"] == 0
    assert doc["gate"] == {"max_regression": 0.0, "exceeded": False}
    (pair,) = doc["collectives"]
    assert pair["baseline"] == pair["candidate"] and pair["baseline"]["calls_per_step"] == 4


@pytest.fixture(scope="module")
def slowed_gloo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The gloo traces 1.25 times slower, made once for the tests that only read them."""
    return _slowed_copy(GLOO, tmp_path_factory.mktemp("compare") / "slow", 1.25)


def test_a_slowed_copy_fails_the_gate(
    slowed_gloo: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    slow = slowed_gloo
    code, out, err = _compare([str(GLOO), str(slow), "--max-regression", "10"], capsys)
    assert code == 3, err
    assert "candidate mean step time worse by 25.0% (limit 10.0%): REGRESSION" in out
    code, _, _ = _compare([str(GLOO), str(slow), "--max-regression", "30"], capsys)
    assert code == 0
    # Faster is never a regression.
    code, _, _ = _compare([str(slow), str(GLOO), "--max-regression", "0"], capsys)
    assert code == 0


def test_with_flops_the_gate_is_mfu(slowed_gloo: Path, capsys: pytest.CaptureFixture[str]) -> None:
    slow = slowed_gloo
    flops = ["--model-flops-per-step", "1G", "--peak-flops", "100G"]
    code, doc = _json([str(GLOO), str(slow), *flops, "--max-regression", "15"], capsys)
    assert code == 3
    regression = doc["regression"]
    assert regression["metric"] == "mfu"
    assert regression["worse_by"] == pytest.approx(0.2, abs=1e-6)  # 1 - 1/1.25
    assert doc["slices_are_waterfall"]
    mfu = doc["headline"][1]
    assert mfu["relative"] == pytest.approx(-0.2, abs=1e-6)


def test_real_a100_trace_against_itself(capsys: pytest.CaptureFixture[str]) -> None:
    require(A100_TRACE)
    trace = str(A100_TRACE)
    code, doc = _json([trace, trace, "--model-flops-per-step", "1T"], capsys)
    assert code == 0
    assert doc["baseline"]["devices"] == ["NVIDIA A100-PG509-200"]
    labels = [r["label"] for r in doc["slices"]]
    assert labels[-2:] == ["unfused kernels", "kernel inefficiency"]
    assert {r["label"] for r in doc["kernel_classes_s"]} == {
        "gemm",
        "attention",
        "elementwise_norm_reduce",
        "other",
    }
    assert all(r["delta"] == 0 for r in doc["slices"] + doc["kernel_classes_s"])
    assert doc["kernel_families_grown_s"] == []  # nothing grew


def test_kernel_families_that_grew_most(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace = require(A100_TRACE)
    (tmp_path / "base").mkdir()
    (tmp_path / "base" / trace.name).symlink_to(trace)
    slow = _slowed_copy(tmp_path / "base", tmp_path / "slow", 1.25)
    code, doc = _json([str(tmp_path / "base"), str(slow), "--max-regression", "10"], capsys)
    assert code == 3
    grown = doc["kernel_families_grown_s"]
    # Every kernel lasts 1.25 times as long: the largest family grew most, each by 25 %.
    assert grown[0]["label"] == "elementwise / norm / reduction / data movement"
    assert [r["label"] for r in grown[:2]] == [
        "elementwise / norm / reduction / data movement",
        "GEMM / matmul",
    ]
    assert all(r["relative"] == pytest.approx(0.25, rel=1e-3) for r in grown)  # µs rounding


def _step(step: int, rank: int, slow: float) -> StepReport:
    # Rank 1 computes 1.6 times as long: a straggler on its own time (x1.23 the median); rank 0
    # waits for it in the all-reduce, so both ranks' steps take as long.
    wall = 0.1 * slow
    compute = 0.06 * (1.6 if rank == 1 else 1.0)
    return StepReport(
        step=step,
        start_unix_ns=1_700_000_000_000_000_000 + step * 100_000_000,
        wall_s=wall,
        model_flops=2e9,
        recompute_flops=0.0,
        components=(
            ComponentShare("compute", compute),
            ComponentShare("exposed_comm", wall - compute, axis="dp", tier="intra_node"),
        ),
        breakdown_step=step,
        collectives=(
            CollectiveSample(
                op="all_reduce",
                axis="dp",
                tier="intra_node",
                group_size=2,
                bytes=1 << 20,
                count=2,
                seconds=1e-3,
                overlapped_s=0.0,
            ),
        ),
        compute_classes=(ClassShare("gemm", compute),),
    )


def _batches(
    slow: float, world_size: int = 2, peak: float = 1e11, run_key: str = "fp-1"
) -> list[ReportBatch]:
    return [
        ReportBatch(
            job="synthetic",
            rank=rank,
            world_size=world_size,
            host="node-0",
            device="cpu",
            peak_flops=peak,
            peak_source="measured",
            sent_unix_ns=first,
            reports=tuple(_step(s, rank, slow) for s in range(first, first + 4)),
            run_key=run_key,
            # 0.8 s of startup per rank: effective MFU below the steps' MFU
            ledger=LedgerTotals(process_start_unix_ns=1, startup_ns=800_000_000),
        )
        for rank in range(2)
        for first in (0, 4)
    ]


def _agent_output(directory: Path, batches: list[ReportBatch]) -> Path:
    directory.mkdir()
    for rank in (0, 1):
        lines = [encode_batch(b).decode() for b in batches if b.rank == rank]
        (directory / f"rank{rank}.jsonl").write_text("\n".join(lines) + "\n")
    return directory


def _summary(path: Path, batches: list[ReportBatch]) -> Path:
    collector = Aggregator(StateConfig(window_steps=8), clock=FakeClock())
    for batch in batches:
        collector.ingest(encode_batch(batch).decode().encode())
    path.write_text(json.dumps(summary(collector.snapshot())))
    return path


def test_agent_outputs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    base = _agent_output(tmp_path / "base", _batches(1.0))
    slow = _agent_output(tmp_path / "slow", _batches(1.2))
    code, doc = _json([str(base), str(slow), "--max-regression", "10"], capsys)
    assert code == 3
    assert doc["baseline"]["kind"] == "agent output"
    assert doc["regression"]["metric"] == "mfu"
    assert doc["regression"]["worse_by"] == pytest.approx(1 - 1 / 1.2)
    exposed = next(r for r in doc["slices"] if r["label"] == "exposed comm dp/intra_node")
    assert exposed["delta"] > 0  # the slower steps are all exposed communication
    assert [r["label"] for r in doc["stragglers"]] == ["rank 1"]
    code, out, _ = _compare([str(base), str(base), "--max-regression", "1"], capsys)
    assert code == 0
    assert "named stragglers, baseline: rank 1" in out


def test_collector_summaries(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    base = _summary(tmp_path / "base.json", _batches(1.0))
    slow = _summary(tmp_path / "slow.json", _batches(1.2))
    code, doc = _json([str(base), str(slow), "--max-regression", "10"], capsys)
    assert code == 3
    assert doc["baseline"]["kind"] == "collector summary"
    assert doc["baseline"]["rank_steps"] == 16
    assert doc["regression"]["worse_by"] == pytest.approx(1 - 1 / 1.2)
    assert doc["collectives"][0]["baseline"]["calls_per_step"] == 2
    # A summary against agent output of the same run: the same MFU, and a warning of kinds.
    agent = _agent_output(tmp_path / "agent", _batches(1.0))
    code, out, err = _compare([str(base), str(agent), "--max-regression", "0.001"], capsys)
    assert code == 0, out
    assert "different inputs (collector summary vs agent output)" in err
    code, doc = _json([str(base), str(agent)], capsys)
    effective = next(r for r in doc["headline"] if r["label"] == "effective MFU")
    # 8 steps of 2e9 FLOPs per rank over 1e11 FLOP/s x (8 x 0.1 s + 0.8 s)
    assert effective["baseline"] == pytest.approx(16e9 / (1e11 * 1.6))
    assert effective["candidate"] == pytest.approx(effective["baseline"])
    assert "effective MFU" in _compare([str(base), str(agent)], capsys)[1]


def test_different_world_sizes_and_peaks_warn(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    base = _agent_output(tmp_path / "base", _batches(1.0))
    wide = _agent_output(tmp_path / "wide", _batches(1.0, world_size=4, run_key="fp-4"))
    code, out, err = _compare([str(base), str(wide)], capsys)
    assert code == 0
    assert "warning: world sizes differ: baseline 2, candidate 4" in err
    assert "warning: run keys differ: baseline fp-1, candidate fp-4" in err
    assert "; run key fp-4" in out
    faster = _agent_output(tmp_path / "faster", _batches(1.0, peak=2e11))
    code, out, err = _compare([str(base), str(faster)], capsys)
    assert code == 0
    assert "peak 100 GFLOP/s (measured)" in out and "peak 200 GFLOP/s (measured)" in out
    assert (
        "peaks differ: baseline 100 GFLOP/s (measured), candidate 200 GFLOP/s (measured) (each "
        "side's MFU is against its own peak, so the MFU change mixes speed with the peak; mean "
        "step time compares speed alone; a measured CPU peak is calibrated once per machine and "
        "thread count, `mfuscope calc --calibrate` measures it again)"
    ) in err
    # The same peaks on both sides: nothing to say about them.
    code, _, err = _compare([str(base), str(base)], capsys)
    assert "peak" not in err


def test_ranks_of_one_run_with_different_peaks_warn(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # The two ranks of one run calibrated 5% apart (each measured its own, before the cache).
    base = _agent_output(tmp_path / "base", _batches(1.0))
    split = [msgspec.structs.replace(b, peak_flops=1.05e11) if b.rank else b for b in _batches(1.0)]
    mixed = _agent_output(tmp_path / "mixed", split)
    code, out, err = _compare([str(base), str(mixed)], capsys)
    assert code == 0
    assert (
        "the candidate's ranks used different peaks (100 GFLOP/s, 105 GFLOP/s): its MFU weighs "
        "each rank against its own"
    ) in err
    assert "peak 100 GFLOP/s, 105 GFLOP/s (measured)" in out


def test_bad_input_is_one_line_and_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = _compare([str(GLOO), str(tmp_path / "absent")], capsys)
    assert (code, out) == (2, "")
    assert err.count("\n") == 1 and "no such file or directory" in err
    empty = tmp_path / "empty.json"
    empty.write_text(json.dumps({"version": 1, "jobs": [{"job": "j", "ranks": 0}]}))
    code, out, err = _compare([str(GLOO), str(empty)], capsys)
    assert (code, out) == (2, "")
    assert err.startswith("mfuscope compare: ") and err.count("\n") == 1
    idle = _summary(tmp_path / "idle.json", [])
    code, _, err = _compare([str(idle), str(GLOO)], capsys)
    assert code == 2 and "holds no job" in err
    nothing = tmp_path / "nothing.json"
    doc = json.loads(_summary(tmp_path / "s.json", _batches(1.0)).read_text())
    doc["jobs"][0].update(steps_total=0, step_seconds_total=0.0)
    nothing.write_text(json.dumps(doc))
    code, _, err = _compare([str(nothing), str(GLOO)], capsys)
    assert code == 2
    assert err.startswith("mfuscope compare: nothing to compare: the baseline")


def test_html_shows_both_sides(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    base = _agent_output(tmp_path / "base", _batches(1.0))
    page_dir = tmp_path / "page"
    code, _, err = _compare([str(base), str(GLOO), "--html", str(page_dir)], capsys)
    assert code == 0
    page = (page_dir / "compare.html").read_text()
    assert "wrote " in err and "<svg" in page
    assert page.count("<figcaption>baseline</figcaption>") == 6
    assert "http://" not in page.replace("http://www.w3.org/", "")
