"""`mfuscope validate-gpu`'s report: measurements in, checks and ``validate.json`` / ``validate.md``
out. Pure: no torch, no clock, no device; the GPU-touching probes (`_probes`) fill `Measurements`.

Every check states its measured value, the expectation and whether it held; a probe that failed
is reported with its error (and fails its checks) instead of stopping the run.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from mfuscope.cli.validate_gpu._agent_report import (
    BreakdownProbe,
    CostProbe,
    MfuProbe,
    agent_checks,
)
from mfuscope.cli.validate_gpu._flight_report import FlightProbe, flight_checks

__all__ = [
    "Check",
    "CollectiveSeen",
    "CounterProbe",
    "Detection",
    "MatmulProbe",
    "Measurements",
    "NcclProbe",
    "TrainingProbe",
    "WindowProbe",
    "build_report",
    "render_markdown",
    "write_report",
]

# Expectations. A large dense bf16 GEMM reaches roughly 0.8 of the spec peak on an H100 SXM; below
# half, the peak row or the clocks are wrong; above 1.05, the peak row is too low.
MATMUL_RATIO_RANGE = (0.5, 1.05)
EVENT_VS_WALL_TOLERANCE = 0.05  # CUDA-event step time within 5 % of synchronised wall time
FLOPS_TOLERANCE = 0.01  # counted FLOPs within 1 % of the analytical count
MAX_OVERHEAD_RATIO = 1.02  # median step with the agent / without it
BUCKET_SUM_TOLERANCE = 1e-6  # relative
MIN_MEMORY_BUSY_UNDER_COPY = 0.2
MIN_PCIE_SHARE_OF_H2D = 0.5  # PCIe counter bytes / bytes copied host -> device
# The whole run on one GPU (s), and with --quick.
RUN_BUDGET_S = 300.0
QUICK_RUN_BUDGET_S = 120.0


@dataclass(frozen=True)
class Detection:
    torch_name: str
    nvml_name: str | None
    peak_flops: float | None
    peak_source: str
    peak_message: str
    gpu_count: int


@dataclass(frozen=True)
class MatmulProbe:
    size: int
    flops_per_s: float


@dataclass(frozen=True)
class TrainingProbe:
    """Medians over the agent-on steps; FLOPs per step; `overhead_ratio` = median step time with
    the agent / without it (interleaved blocks). `sync_error`: what sync debug mode raised."""

    steps: int
    event_step_s: float
    wall_step_s: float
    counted_model_flops: float
    analytical_model_flops: float
    mfu: float | None
    hfu: float | None
    overhead_ratio: float
    sync_error: str | None
    agent_internal_errors: int


@dataclass(frozen=True)
class WindowProbe:
    """One profiled step decomposed from the real CUDA trace; `buckets` in seconds."""

    wall_s: float
    buckets: Mapping[str, float]
    kernels: int


@dataclass(frozen=True)
class CollectiveSeen:
    op: str
    bytes: int | None
    seconds: float
    busbw_bytes_per_s: float | None


@dataclass(frozen=True)
class NcclProbe:
    world_size: int
    expected_bytes: int
    collectives: tuple[CollectiveSeen, ...]
    kernel_names: tuple[str, ...] = ()  # for the report when nothing was recognised


@dataclass(frozen=True)
class CounterProbe:
    """Hardware counters read around two loads. None: the counter could not be read."""

    memory_busy_idle: float | None
    memory_busy_under_copy: float | None
    h2d_bytes: int
    pcie_rx_bytes: int | None
    pcie_tx_bytes: int | None
    sm_clock_ratio: float | None
    power_watts: float | None


@dataclass(frozen=True)
class Measurements:
    """What the probes found; a probe that failed leaves None and an entry in `errors`."""

    detection: Detection | None = None
    matmul: MatmulProbe | None = None
    training: TrainingProbe | None = None
    window: WindowProbe | None = None
    nccl: NcclProbe | None = None
    counters: CounterProbe | None = None
    flight: FlightProbe | None = None
    mfu_truth: MfuProbe | None = None
    breakdown: BreakdownProbe | None = None
    hot_path: CostProbe | None = None
    errors: Mapping[str, str] = field(default_factory=dict)
    wall_s: float = 0.0
    quick: bool = False


@dataclass(frozen=True)
class Check:
    name: str
    ok: bool
    measured: str
    expected: str


def _ratio(a: float, b: float) -> float:
    return a / b if b else math.inf


def _detection_checks(m: Measurements) -> list[Check]:
    d = m.detection
    if d is None:
        return [Check("peak table row", False, m.errors.get("detection", "not run"), "a row")]
    return [
        Check(
            "peak table row",
            d.peak_flops is not None,
            f"{d.torch_name}: {d.peak_message}",
            "the device is in the peak table (dense bf16)",
        )
    ]


def _matmul_checks(m: Measurements) -> list[Check]:
    d, mm = m.detection, m.matmul
    if mm is None or d is None or d.peak_flops is None:
        why = m.errors.get("matmul", "no matmul rate or no peak")
        return [Check("bf16 matmul rate / peak", False, why, "0.5 .. 1.05")]
    ratio = mm.flops_per_s / d.peak_flops
    lo, hi = MATMUL_RATIO_RANGE
    return [
        Check(
            "bf16 matmul rate / peak",
            lo <= ratio <= hi,
            f"{mm.flops_per_s / 1e12:.1f} TFLOP/s / {d.peak_flops / 1e12:.0f} = {ratio:.3f}",
            f"{lo} .. {hi} (about 0.8 on an H100 SXM)",
        )
    ]


def _training_checks(m: Measurements) -> list[Check]:
    t = m.training
    if t is None:
        why = m.errors.get("training", "not run")
        names = ("event vs wall step time", "counted vs analytical FLOPs", "MFU <= HFU")
        return [Check(n, False, why, "") for n in (*names, "agent overhead", "no host sync")]
    event_wall = _ratio(t.event_step_s, t.wall_step_s)
    flops = _ratio(t.counted_model_flops, t.analytical_model_flops)
    mfu_ok = t.mfu is not None and t.hfu is not None and 0 < t.mfu <= t.hfu <= 1
    return [
        Check(
            "event vs wall step time",
            abs(event_wall - 1) <= EVENT_VS_WALL_TOLERANCE,
            f"{t.event_step_s * 1e3:.2f} ms / {t.wall_step_s * 1e3:.2f} ms = {event_wall:.4f}",
            f"1 +- {EVENT_VS_WALL_TOLERANCE}",
        ),
        Check(
            "counted vs analytical FLOPs",
            abs(flops - 1) <= FLOPS_TOLERANCE,
            f"{t.counted_model_flops:.4g} / {t.analytical_model_flops:.4g} = {flops:.5f}",
            f"1 +- {FLOPS_TOLERANCE}",
        ),
        Check("MFU <= HFU", mfu_ok, f"MFU {t.mfu}, HFU {t.hfu}", "0 < MFU <= HFU <= 1"),
        Check(
            "agent overhead",
            t.overhead_ratio <= MAX_OVERHEAD_RATIO,
            f"median step with / without the agent = {t.overhead_ratio:.4f}",
            f"<= {MAX_OVERHEAD_RATIO}",
        ),
        Check(
            "no host sync",
            t.sync_error is None and t.agent_internal_errors == 0,
            t.sync_error or f"none; agent internal errors {t.agent_internal_errors}",
            "ordinary steps run under torch.cuda.set_sync_debug_mode('error')",
        ),
    ]


def _window_checks(m: Measurements) -> list[Check]:
    w = m.window
    if w is None:
        return [Check("buckets sum to the window", False, m.errors.get("window", "not run"), "")]
    total = math.fsum(w.buckets.values())
    ok = w.kernels > 0 and math.isclose(total, w.wall_s, rel_tol=BUCKET_SUM_TOLERANCE)
    return [
        Check(
            "buckets sum to the window",
            ok,
            f"{total:.9f} s of {w.wall_s:.9f} s, {w.kernels} kernels",
            "equal, with kernels on the device timeline",
        )
    ]


def _nccl_checks(m: Measurements) -> list[Check]:
    n = m.nccl
    if n is None:
        return [Check("NCCL collectives recognised", False, m.errors.get("nccl", "not run"), "")]
    sized = [c for c in n.collectives if c.op == "all_reduce" and c.bytes == n.expected_bytes]
    busbw = [c.busbw_bytes_per_s for c in sized if c.busbw_bytes_per_s is not None]
    seen = ", ".join(sorted({f"{c.op} {c.bytes} B" for c in n.collectives})) or (
        f"none (device kernels: {', '.join(n.kernel_names) or 'none'})"
    )
    return [
        Check(
            "NCCL collectives recognised",
            bool(sized) and bool(busbw),
            f"world size {n.world_size}: {seen}",
            f"all_reduce of {n.expected_bytes} B with a busbw",
        )
    ]


def _counter_checks(m: Measurements) -> list[Check]:
    c = m.counters
    if c is None:
        why = m.errors.get("counters", "not run")
        return [Check(n, False, why, "") for n in ("HBM busy moves", "PCIe bytes move")]
    busy_ok = (
        c.memory_busy_under_copy is not None
        and c.memory_busy_idle is not None
        and c.memory_busy_under_copy >= MIN_MEMORY_BUSY_UNDER_COPY
        and c.memory_busy_under_copy > c.memory_busy_idle
    )
    pcie = (
        None
        if c.pcie_rx_bytes is None and c.pcie_tx_bytes is None
        else (max(c.pcie_rx_bytes or 0, c.pcie_tx_bytes or 0))
    )
    return [
        Check(
            "HBM busy moves",
            busy_ok,
            f"idle {c.memory_busy_idle}, during a device copy {c.memory_busy_under_copy}",
            f">= {MIN_MEMORY_BUSY_UNDER_COPY} under the copy and above idle",
        ),
        Check(
            "PCIe bytes move",
            pcie is not None and pcie >= MIN_PCIE_SHARE_OF_H2D * c.h2d_bytes,
            f"{pcie} counter bytes for {c.h2d_bytes} bytes copied host -> device",
            f">= {MIN_PCIE_SHARE_OF_H2D} x the bytes copied",
        ),
    ]


def _run_time_check(m: Measurements) -> Check:
    budget = QUICK_RUN_BUDGET_S if m.quick else RUN_BUDGET_S
    return Check("run time", m.wall_s <= budget, f"{m.wall_s:.0f} s", f"<= {budget:.0f} s")


def build_report(m: Measurements) -> dict[str, Any]:
    """The JSON-ready report: every measurement, every check, and the overall verdict."""
    agent = agent_checks(m.mfu_truth, m.breakdown, m.hot_path, m.errors)
    checks = [
        *_detection_checks(m),
        *_matmul_checks(m),
        *_training_checks(m),
        *_window_checks(m),
        *(Check(c.name, c.ok, c.measured, c.expected) for c in agent),
        *_nccl_checks(m),
        *_counter_checks(m),
        *(Check(c.name, c.ok, c.measured, c.expected) for c in flight_checks(m.flight, m.errors)),
        _run_time_check(m),
    ]
    return {
        "ok": all(c.ok for c in checks),
        "quick": m.quick,
        "wall_s": m.wall_s,
        "checks": [asdict(c) for c in checks],
        "measurements": {
            name: None if value is None else asdict(value)
            for name, value in (
                ("detection", m.detection),
                ("matmul", m.matmul),
                ("training", m.training),
                ("window", m.window),
                ("nccl", m.nccl),
                ("counters", m.counters),
                ("flight", m.flight),
                ("mfu_truth", m.mfu_truth),
                ("breakdown", m.breakdown),
                ("hot_path", m.hot_path),
            )
        },
        "errors": dict(m.errors),
    }


def render_markdown(report: Mapping[str, Any]) -> str:
    """``validate.md``: the verdict, then one table row per check."""
    detection = report["measurements"].get("detection") or {}
    lines = [
        "# mfuscope validate-gpu",
        "",
        f"Device: {detection.get('torch_name', 'unknown')} "
        f"({detection.get('gpu_count', '?')} visible). "
        f"Result: **{'PASS' if report['ok'] else 'FAIL'}** in {report['wall_s']:.0f} s"
        f"{' (quick)' if report['quick'] else ''}.",
        "",
        "| check | ok | measured | expected |",
        "|---|---|---|---|",
    ]
    for check in report["checks"]:
        cells = [check["name"], "yes" if check["ok"] else "**no**"]
        cells += [str(check["measured"]).replace("|", "/"), check["expected"].replace("|", "/")]
        lines.append("| " + " | ".join(cells) + " |")
    errors: Sequence[tuple[str, str]] = sorted(report["errors"].items())
    if errors:
        lines += ["", "## Probe errors", ""]
        lines += [f"- {name}: {text}" for name, text in errors]
    return "\n".join(lines) + "\n"


def write_report(report: Mapping[str, Any], out_dir: Path) -> tuple[Path, Path]:
    """Write ``validate.json`` and ``validate.md`` into `out_dir` (created if missing)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    json_path, md_path = out_dir / "validate.json", out_dir / "validate.md"
    json_path.write_text(json.dumps(report, indent=2, allow_nan=False) + "\n", encoding="utf-8")
    md_path.write_text(render_markdown(report), encoding="utf-8")
    return json_path, md_path
