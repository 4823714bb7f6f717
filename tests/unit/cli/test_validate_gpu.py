"""`mfuscope validate-gpu`: the clean skip without CUDA, and the report assembled from measurements
(the probes themselves need a GPU; here they are replaced by `Measurements` built by hand)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest
from mfuscope.cli import main
from mfuscope.cli import validate_gpu as command
from mfuscope.cli.validate_gpu import _run
from mfuscope.cli.validate_gpu._agent_report import BreakdownProbe, CostProbe, MfuProbe, Shares
from mfuscope.cli.validate_gpu._flight_report import (
    DumpComparison,
    FlightProbe,
    OpTraffic,
    StallProbe,
)
from mfuscope.cli.validate_gpu._report import (
    CollectiveSeen,
    CounterProbe,
    Detection,
    MatmulProbe,
    Measurements,
    NcclProbe,
    TrainingProbe,
    WindowProbe,
    build_report,
    render_markdown,
)

H100 = 989e12

# What a healthy H100 SXM run looks like (figures of the expected order, not measured ones).
HEALTHY = Measurements(
    detection=Detection("NVIDIA H100 80GB HBM3", "NVIDIA H100 80GB HBM3", H100, "spec", "h100", 1),
    matmul=MatmulProbe(8192, 0.78 * H100),
    training=TrainingProbe(
        steps=215,
        event_step_s=0.0502,
        wall_step_s=0.0500,
        counted_model_flops=1.2e13,
        analytical_model_flops=1.2e13,
        mfu=0.24,
        hfu=0.24,
        overhead_ratio=1.004,
        sync_error=None,
        agent_internal_errors=0,
    ),
    window=WindowProbe(
        wall_s=0.05,
        buckets={
            "compute": 0.04,
            "recompute": 0.0,
            "exposed_comm": 0.0,
            "other": 0.004,
            "bubble": 0.006,
        },
        kernels=1_200,
    ),
    nccl=NcclProbe(1, 1 << 26, (CollectiveSeen("all_reduce", 1 << 26, 1e-4, 0.0),)),
    counters=CounterProbe(
        memory_busy_idle=0.0,
        memory_busy_under_copy=0.93,
        h2d_bytes=8 << 30,
        pcie_rx_bytes=8_700_000_000,
        pcie_tx_bytes=40_000_000,
        sm_clock_ratio=0.98,
        power_watts=420.0,
    ),
    flight=FlightProbe(
        world_size=2,
        native=True,
        dumps=(DumpComparison("generic", 0, True), DumpComparison("nccl", 18, True)),
        timed=15,
        done=15,
        all_reduce_event_s=0.0019,
        traffic=(
            OpTraffic("all_gather", 5, 10 << 20, 0.0019, 5, 10 << 20),
            OpTraffic("all_reduce", 5, 5 << 20, 0.0018, 5, 5 << 20),
            OpTraffic("broadcast", 5, 5 << 20, 0.0009, 5, 5 << 20),
        ),
        stall=StallProbe("peer", 1, 7, (1,), (7,), ("all_reduce",), 10.5),
    ),
    mfu_truth=MfuProbe(36, 8.8e12, 8.8e12, H100, 0.7101, 0.7098),
    breakdown=BreakdownProbe(
        truth=Shares(0.66, 0.11, 0.23),
        window=Shares(0.65, 0.11, 0.24),
        carried=Shares(0.66, 0.10, 0.24),
        window_steps=3,
        carried_steps=40,
        window_error=0.012,
        carried_error=0.021,
    ),
    hot_path=CostProbe(4000, 0.3e-6, 2.9e-6, 4.1e-6, 9.0e-6, 2.6e-6, 7.5e-6, "...", ""),
    wall_s=190.0,
)


def _failed(measurements: Measurements) -> set[str]:
    report = build_report(measurements)
    assert report["ok"] == (not any(not c["ok"] for c in report["checks"]))
    return {c["name"] for c in report["checks"] if not c["ok"]}


def test_without_cuda_it_prints_one_line_and_exits_0(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert not command.cuda_available()  # this machine has no GPU
    assert main(["validate-gpu", "--out", str(tmp_path / "out"), "--quick"]) == 0
    captured = capsys.readouterr()
    assert captured.out == "no CUDA device: validate-gpu skipped\n"
    assert captured.err == ""
    assert not (tmp_path / "out").exists()


def test_a_healthy_run_passes_every_check() -> None:
    report = build_report(HEALTHY)
    assert report["ok"], [c for c in report["checks"] if not c["ok"]]
    assert len(report["checks"]) == 21
    matmul = next(c for c in report["checks"] if c["name"] == "bf16 matmul rate / peak")
    assert matmul["measured"].endswith("= 0.780")
    json.dumps(report, allow_nan=False)


@pytest.mark.parametrize(
    ("change", "failing"),
    [
        # A peak row too low for the device: the GEMM "beats" the peak.
        ({"matmul": MatmulProbe(8192, 1.3 * H100)}, {"bf16 matmul rate / peak"}),
        (
            {"detection": dataclasses.replace(HEALTHY.detection, peak_flops=None)},
            {"peak table row", "bf16 matmul rate / peak"},
        ),
        (
            {"training": dataclasses.replace(HEALTHY.training, event_step_s=0.06)},
            {"event vs wall step time"},
        ),
        (
            {"training": dataclasses.replace(HEALTHY.training, counted_model_flops=1.5e13)},
            {"counted vs analytical FLOPs"},
        ),
        ({"training": dataclasses.replace(HEALTHY.training, mfu=0.3, hfu=0.2)}, {"MFU <= HFU"}),
        (
            {"training": dataclasses.replace(HEALTHY.training, overhead_ratio=1.05)},
            {"agent overhead"},
        ),
        (
            {
                "training": dataclasses.replace(
                    HEALTHY.training, sync_error="called a synchronizing CUDA operation"
                )
            },
            {"no host sync"},
        ),
        (
            {"training": dataclasses.replace(HEALTHY.training, agent_internal_errors=3)},
            {"no host sync"},
        ),
        (
            {"window": dataclasses.replace(HEALTHY.window, wall_s=0.06)},
            {"buckets sum to the window"},
        ),
        (
            {"window": dataclasses.replace(HEALTHY.window, kernels=0)},
            {"buckets sum to the window"},
        ),
        ({"nccl": NcclProbe(1, 1 << 26, ())}, {"NCCL collectives recognised"}),
        # over budget: 5 minutes, 2 with --quick
        ({"wall_s": 301.0}, {"run time"}),
        ({"wall_s": 121.0, "quick": True}, {"run time"}),
        (
            {"mfu_truth": None, "breakdown": None, "hot_path": None},
            {
                "MFU vs CUDA-event ground truth",
                "window breakdown vs CUDA events",
                "carried breakdown vs CUDA events",
                "agent cost per step (device path)",
                "hot path calls on the device",
            },
        ),
        (
            {"nccl": NcclProbe(1, 1 << 26, (CollectiveSeen("all_reduce", None, 1e-4, None),))},
            {"NCCL collectives recognised"},
        ),
        (
            {"counters": dataclasses.replace(HEALTHY.counters, memory_busy_under_copy=0.05)},
            {"HBM busy moves"},
        ),
        (
            {
                "counters": dataclasses.replace(
                    HEALTHY.counters, pcie_rx_bytes=None, pcie_tx_bytes=None
                )
            },
            {"PCIe bytes move"},
        ),
    ],
)
def test_each_check_can_fail(change: dict[str, Any], failing: set[str]) -> None:
    assert _failed(dataclasses.replace(HEALTHY, **change)) == failing


def test_a_failed_probe_fails_its_checks_and_is_named() -> None:
    broken = dataclasses.replace(
        HEALTHY, nccl=None, counters=None, errors={"nccl": "RuntimeError: NCCL error"}
    )
    assert _failed(broken) == {"NCCL collectives recognised", "HBM busy moves", "PCIe bytes move"}
    text = render_markdown(build_report(broken))
    assert "Result: **FAIL**" in text
    assert "- nccl: RuntimeError: NCCL error" in text


def test_run_writes_both_files_and_sets_the_exit_code(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    outcomes = iter([HEALTHY, dataclasses.replace(HEALTHY, counters=None)])
    monkeypatch.setattr(command, "cuda_available", lambda: True)
    monkeypatch.setattr(_run, "measure_all", lambda **_: next(outcomes))
    assert main(["validate-gpu", "--out", str(tmp_path)]) == 0
    report = json.loads((tmp_path / "validate.json").read_text())
    assert report["ok"] and report["measurements"]["matmul"]["size"] == 8192
    markdown = (tmp_path / "validate.md").read_text()
    assert "Result: **PASS**" in markdown
    assert markdown.count("\n| ") == 22  # header + 21 checks
    printed = capsys.readouterr().out.splitlines()
    assert len(printed) == 22 and printed[-1].startswith("PASS: wrote ")
    assert "ok   flight recorder: stalled rank named: peer: suspects [1] at [7]" in printed[-3]
    assert printed[-2] == "ok   run time: 190 s"
    assert main(["validate-gpu", "--out", str(tmp_path)]) == 1
    printed = capsys.readouterr().out.splitlines()
    assert "FAIL HBM busy moves: not run" in printed
    assert printed[-1].startswith("FAIL: wrote ")


def test_unrecognised_nccl_run_lists_the_device_kernels() -> None:
    nothing = NcclProbe(1, 1 << 26, (), kernel_names=("oneRankReduce", "vectorized_elementwise"))
    report = build_report(dataclasses.replace(HEALTHY, nccl=nothing))
    check = next(c for c in report["checks"] if c["name"] == "NCCL collectives recognised")
    assert not check["ok"]
    assert check["measured"].endswith(
        "none (device kernels: oneRankReduce, vectorized_elementwise)"
    )
