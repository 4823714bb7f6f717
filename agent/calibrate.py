"""A measured CPU peak: time square matmuls for a short while and keep the best rate.

CPUs have no datasheet peak we could trust for this purpose (it depends on the SIMD units, the
clock under load, the thread count torch uses and the BLAS build), so a CPU run's MFU denominator
is measured, and labelled ``source="measured"`` so nobody mistakes it for a spec figure.

Method: square n x n matmuls (2*n^3 FLOPs each) in batches; the result is the best batch rate
(FLOP/s) seen within the time budget. Best rather than mean because a peak is what the hardware
can do, and the other engineers' processes on a shared machine only ever slow a batch down. One
warm-up matmul runs first (thread pool start-up, page faults) and is not timed.

The agent measures once per machine and keeps the figure (`cached_cpu_peak`, the cache in
`mfuscope.agent.peak_cache`): `calibrate_cpu_peak` runs `rounds` rounds, keeps the best rate and
their spread, so a cached figure says how steady the machine was when it was taken.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import torch
from mfuscope.agent.peak_cache import (
    Calibration,
    CalibrationKey,
    CpuPeak,
    affinity_cpus,
    cpu_model,
    cpu_peak,
    default_cache_dir,
)
from mfuscope.core.hardware import PeakLookup, normalize_dtype

__all__ = [
    "CALIBRATION_ROUNDS",
    "CALIBRATION_S",
    "cached_cpu_peak",
    "calibrate_cpu_peak",
    "calibration_key",
    "measure_cpu_peak_flops",
    "measured_cpu_peak",
]

_TORCH_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
DEFAULT_MATRIX_SIZE = 512
_MATMULS_PER_BATCH = 4
# Measured once per machine (then cached), so it can afford longer than a start-up would: 2 s in
# 5 rounds. Bump METHOD_VERSION when the method changes, so old cached figures are not reused.
CALIBRATION_S = 2.0
CALIBRATION_ROUNDS = 5
METHOD_VERSION = 1


def measure_cpu_peak_flops(
    dtype: str = "fp32",
    seconds: float = 0.5,
    *,
    matrix_size: int = DEFAULT_MATRIX_SIZE,
    clock: Callable[[], float] = time.perf_counter,
) -> float:
    """Best matmul rate of this process on the CPU, in FLOP/s, measured for about `seconds`.

    `dtype` is ``"fp32"``, ``"bf16"`` or ``"fp16"`` (``"tf32"`` means fp32 on a CPU). At least one
    batch of matmuls runs even if `seconds` is tiny. Uses torch's current intra-op thread count.
    """
    kind = normalize_dtype(dtype)
    if kind == "tf32":
        kind = "fp32"
    if kind not in _TORCH_DTYPES:
        raise ValueError(f"no CPU matmul calibration for {dtype!r}; use fp32, bf16 or fp16")
    if not seconds > 0:
        raise ValueError(f"seconds must be > 0, got {seconds}")
    if matrix_size < 1:
        raise ValueError(f"matrix_size must be >= 1, got {matrix_size}")
    n = matrix_size
    torch_dtype = _TORCH_DTYPES[kind]
    a = torch.randn(n, n).to(torch_dtype)
    b = torch.randn(n, n).to(torch_dtype)
    out = torch.empty(n, n, dtype=torch_dtype)
    torch.mm(a, b, out=out)  # warm-up, not timed
    flops_per_batch = 2.0 * n**3 * _MATMULS_PER_BATCH
    best = 0.0
    deadline = clock() + seconds
    while True:
        start = clock()
        for _ in range(_MATMULS_PER_BATCH):
            torch.mm(a, b, out=out)
        elapsed = clock() - start
        if elapsed > 0:
            best = max(best, flops_per_batch / elapsed)
        if clock() >= deadline:
            break
    if best <= 0:
        raise RuntimeError("the clock did not advance during calibration")
    return best


def _cpu_dtype(dtype: str) -> str:
    kind = normalize_dtype(dtype)
    return "fp32" if kind == "tf32" else kind


def calibrate_cpu_peak(
    dtype: str = "fp32",
    seconds: float = CALIBRATION_S,
    rounds: int = CALIBRATION_ROUNDS,
    *,
    measure: Callable[[str, float], float] | None = None,
) -> Calibration:
    """`rounds` runs of `measure_cpu_peak_flops` over `seconds` in all: the best rate (FLOP/s) and
    the spread of the rounds' rates, (best - worst) / best. `measure(dtype, seconds)` stands in
    for `measure_cpu_peak_flops` in tests."""
    if rounds < 1:
        raise ValueError(f"rounds must be >= 1, got {rounds}")
    run = measure or measure_cpu_peak_flops
    rates = [run(dtype, seconds / rounds) for _ in range(rounds)]
    best = max(rates)
    return Calibration(best, (best - min(rates)) / best, rounds, seconds)


def calibration_key(
    dtype: str = "fp32",
    seconds: float = CALIBRATION_S,
    rounds: int = CALIBRATION_ROUNDS,
    *,
    threads: int | None = None,
) -> CalibrationKey:
    """The cache key of this machine's peak for `dtype` with torch's current thread count."""
    method = (
        f"v{METHOD_VERSION} mm{DEFAULT_MATRIX_SIZE}x{_MATMULS_PER_BATCH} best of {rounds} "
        f"rounds in {seconds:g} s, torch {torch.__version__}"
    )
    return CalibrationKey(
        cpu_model=cpu_model(),
        cpus=affinity_cpus(),
        threads=torch.get_num_threads() if threads is None else threads,
        dtype=_cpu_dtype(dtype),
        method=method,
    )


def cached_cpu_peak(
    dtype: str = "fp32",
    *,
    cache_dir: str | Path | None = None,
    recalibrate: bool = False,
    incarnation: str = "",
    seconds: float = CALIBRATION_S,
    rounds: int = CALIBRATION_ROUNDS,
) -> CpuPeak:
    """This machine's CPU peak for `dtype`: cached (`mfuscope.agent.peak_cache`), else measured
    with `calibrate_cpu_peak` and cached. `cache_dir` None: the user's cache directory."""
    kind = _cpu_dtype(dtype)
    if kind not in _TORCH_DTYPES:
        raise ValueError(f"no CPU matmul calibration for {dtype!r}; use fp32, bf16 or fp16")
    return cpu_peak(
        calibration_key(kind, seconds, rounds),
        lambda: calibrate_cpu_peak(kind, seconds, rounds),
        directory=Path(cache_dir) if cache_dir is not None else default_cache_dir(),
        recalibrate=recalibrate,
        incarnation=incarnation,
    )


def measured_cpu_peak(dtype: str = "fp32", seconds: float = 0.5) -> PeakLookup:
    """`measure_cpu_peak_flops` wrapped as a ``source="measured"`` `PeakLookup` for the CPU."""
    peak = measure_cpu_peak_flops(dtype, seconds)
    threads = torch.get_num_threads()
    return PeakLookup(
        peak,
        "measured",
        "cpu",
        f"CPU {normalize_dtype(dtype)} matmul peak measured over {seconds:g} s with "
        f"{threads} thread(s): {peak / 1e9:.1f} GFLOP/s (a measurement, not a spec)",
    )
