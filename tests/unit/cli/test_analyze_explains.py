"""`mfuscope analyze` says what its figures are of: the peak and where it came from (the
datasheet table for --dtype when --peak-flops is not given), FLOPs with suffixes as in `calc`, a
reason for every `-` (text and JSON), the MFU waterfall and busbw against the tier's spec in the
text, and traces found in subfolders too."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from mfuscope.cli import main

from tests.support.shared_data import MI300X_TRACE, require
from tests.support.trace_builder import Group, TraceBuilder

H100_BF16 = 989.4e12  # dense, the datasheet table's row (tests/unit/core/test_hardware_peaks.py)


def _trace(path: Path, *, device: str = "NVIDIA H100 80GB HBM3", recompute: bool = False) -> Path:
    b = TraceBuilder(world_size=2, groups=(Group("0", "default_pg", (0, 1)),))
    b.device_name = device
    b.profiler_step(1, 0.0, 10.0)
    if recompute:
        b.cpu_op("autograd::engine::evaluate_function: CheckpointFunctionBackward", 0.5, 9.0)
        b.cpu_op("CheckpointFunctionBackward", 0.6, 8.0)
    b.kernel(20.0, 50.0, launch_at=1.0, recompute=recompute)
    b.kernel(70.0, 10.0, launch_at=9.5)
    b.comm_kernel(80.0, 20.0, launch_at=9.6, nelems=1 << 20)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(b.build()))
    return path


def _json(args: list[str], capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
    assert main(["analyze", *args, "--json"]) == 0
    doc: dict[str, Any] = json.loads(capsys.readouterr().out)
    return doc


def _steps(doc: dict[str, Any]) -> list[dict[str, Any]]:
    steps: list[dict[str, Any]] = doc["ranks"][0]["steps"]
    return steps


def test_the_peak_comes_from_the_table_for_the_dtype(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _trace(tmp_path / "r.json")
    (step,) = _steps(_json([str(path), "--model-flops-per-step", "3G"], capsys))
    assert step["mfu"] == pytest.approx(3e9 / (H100_BF16 * 80e-6))
    (fp8,) = _steps(_json([str(path), "--model-flops-per-step", "3e9", "--dtype", "fp8"], capsys))
    assert fp8["mfu"] == pytest.approx(3e9 / (1978.9e12 * 80e-6))  # the dense FP8 row
    assert main(["analyze", str(path), "--model-flops-per-step", "2.5T"]) == 0
    out = capsys.readouterr().out
    assert "peak 989.4 TFLOP/s (datasheet table)" in out
    assert main(["analyze", str(path), "--peak-flops", "1P"]) == 0
    assert "peak 1000 TFLOP/s (--peak-flops)" in capsys.readouterr().out
    code = main(["analyze", str(path), "--dtype", "fp7"])
    assert code == 2 and "unknown dtype 'fp7'" in capsys.readouterr().err


def test_every_dash_has_its_reason_in_text_and_json(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    unknown = _trace(tmp_path / "acme.json", device="Acme Inference Card")
    assert main(["analyze", str(unknown), "--model-flops-per-step", "3e9"]) == 0
    out = capsys.readouterr().out
    assert "peak unknown" in out
    assert "note: MFU and HFU '-': unknown device 'Acme Inference Card'" in out
    doc = _json([str(unknown)], capsys)
    (rank,) = doc["ranks"]
    assert any("no model FLOPs per step" in w for w in rank["warnings"])
    recomputing = _trace(tmp_path / "ckpt.json", recompute=True)
    assert main(["analyze", str(recomputing), "--model-flops-per-step", "3e9"]) == 0
    out = capsys.readouterr().out
    assert "note: HFU '-': the steps recompute activations" in out
    (rank,) = _json([str(recomputing), "--model-flops-per-step", "3e9"], capsys)["ranks"]
    assert rank["steps"][0]["hfu"] is None and rank["steps"][0]["mfu"] is not None
    assert any("--recompute-flops-per-step was not given" in w for w in rank["warnings"])
    doc = _json([str(recomputing), "--model-flops-per-step", "3e9"], capsys)
    assert any(w.startswith("rank 0: HFU '-': the steps recompute") for w in doc["warnings"])
    assert main(["analyze", str(recomputing), "--model-flops-per-step", "3e9",
                 "--recompute-flops-per-step", "1e9"]) == 0  # fmt: skip
    assert "note:" not in capsys.readouterr().out


def test_text_gives_the_waterfall_and_busbw_against_the_spec(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _trace(tmp_path / "r.json")
    assert main(["analyze", str(path), "--model-flops-per-step", "30G"]) == 0
    out = capsys.readouterr().out
    mfu = 30e9 / (H100_BF16 * 80e-6)
    assert f"waterfall (step 1): MFU {mfu:.1%} = 100% - exposed comm 25.0%" in out
    header, row = [line for line in out.splitlines() if "all_reduce" in line or "of spec" in line]
    assert header.endswith("busbw GB/s  of spec")
    busbw = float(row.split()[-2]) * 1e9
    assert row.endswith(f"{busbw / 450e9:7.1%}")  # NVLink 4: 450 GB/s per direction


def test_a_directory_is_searched_in_its_subfolders(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _trace(tmp_path / "run" / "node0" / "rank0.json")
    _trace(tmp_path / "run" / "node1" / "deeper" / "rank1.json")
    doc = _json([str(tmp_path / "run")], capsys)
    assert len(doc["ranks"]) == 2


def test_the_mi300x_trace_gets_its_peak_and_says_why_hfu_is_missing(
    capsys: pytest.CaptureFixture[str],
) -> None:
    trace = require(MI300X_TRACE)
    assert main(["analyze", str(trace), "--model-flops-per-step", "2.5T"]) == 0
    out = capsys.readouterr().out
    assert "peak 1307 TFLOP/s (datasheet table)" in out
    assert "note: HFU '-': the steps recompute activations" in out
    assert "waterfall (steps 15-17): MFU" in out
