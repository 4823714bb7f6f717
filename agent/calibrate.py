"""A measured CPU peak: time square matmuls for a short while and keep the best rate.

CPUs have no datasheet peak we could trust for this purpose (it depends on the SIMD units, the
clock under load, the thread count torch uses and the BLAS build), so a CPU run's MFU denominator
is measured, and labelled ``source="measured"`` so nobody mistakes it for a spec figure.

Method: square n x n matmuls (2*n^3 FLOPs each) in batches; the result is the best batch rate
(FLOP/s) seen within the time budget. Best rather than mean because a peak is what the hardware
can do, and the other engineers' processes on a shared machine only ever slow a batch down. One
warm-up matmul runs first (thread pool start-up, page faults) and is not timed.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch
from mfuscope.core.hardware import PeakLookup, normalize_dtype

__all__ = ["measure_cpu_peak_flops", "measured_cpu_peak"]

_TORCH_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
DEFAULT_MATRIX_SIZE = 512
_MATMULS_PER_BATCH = 4


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
