"""Runs the probes in order, each guarded: a probe that fails is recorded and the next one runs.

Budget (one GPU): at most 5 minutes, `--quick` at most 2 (the report's "run time" check holds
the run to it). The flight-recorder probe takes about 20 s either way: its deliberate stall must
outlast the hang join's 10 s threshold. The agent probes (`_agent_probes`) share one world-size-1
NCCL group, made for them and destroyed before the NCCL and flight-recorder probes make theirs.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any, TypeVar

from mfuscope.cli.validate_gpu import _agent_probes, _flight, _probes
from mfuscope.cli.validate_gpu._report import Measurements

__all__ = ["measure_all"]

T = TypeVar("T")


def _guarded(name: str, probe: Callable[[], T], errors: dict[str, str], log: IO[str]) -> T | None:
    start = time.monotonic()
    print(f"validate-gpu: {name} ...", file=log, flush=True)
    try:
        result = probe()
    except Exception as exc:  # the report names the failure; the other probes still run
        errors[name] = f"{type(exc).__name__}: {exc}".splitlines()[0]
        print(f"validate-gpu: {name} failed: {errors[name]}", file=log, flush=True)
        return None
    print(f"validate-gpu: {name} done in {time.monotonic() - start:.1f} s", file=log, flush=True)
    return result


def measure_all(*, out_dir: Path, quick: bool, log: IO[str]) -> Measurements:
    """Every probe, in order; sizes shrink with `quick`."""
    start = time.monotonic()
    out_dir.mkdir(parents=True, exist_ok=True)
    errors: dict[str, str] = {}
    detection = _guarded("detection", _probes.detect, errors, log)
    matmul = _guarded(
        "matmul",
        lambda: _probes.matmul_rate(4096 if quick else 8192, 50 if quick else 100),
        errors,
        log,
    )
    size = _probes.QUICK_MODEL if quick else _probes.FULL_MODEL
    setup: Any = _guarded("model", lambda: _probes.TrainingSetup(size), errors, log)
    training = window = None
    if setup is not None:
        training = _guarded(
            "training",
            lambda: _probes.training(setup, out_dir, rounds=4 if quick else 10, block=10),
            errors,
            log,
        )
        window = _guarded("window", lambda: _probes.profiled_window(setup, out_dir), errors, log)
        del setup
    peak = detection.peak_flops if detection is not None and detection.peak_flops else None
    mfu_truth, breakdown, hot_path = _agent_probes_run(out_dir, quick, peak or 1e15, errors, log)
    nccl = _guarded(
        "nccl",
        lambda: _probes.nccl_collectives(
            out_dir,
            megabytes=16 if quick else 64,
            gpus=detection.gpu_count if detection is not None else 1,
        ),
        errors,
        log,
    )
    counters = _guarded(
        "counters",
        lambda: _probes.counters(seconds=1.5 if quick else 3.0, gigabytes=2 if quick else 8),
        errors,
        log,
    )
    gpus = detection.gpu_count if detection is not None else 1
    flight = _guarded(
        "flight recorder", lambda: _flight.flight_probe(out_dir, gpus=gpus), errors, log
    )
    return Measurements(
        detection=detection,
        matmul=matmul,
        training=training,
        window=window,
        nccl=nccl,
        counters=counters,
        flight=flight,
        mfu_truth=mfu_truth,
        breakdown=breakdown,
        hot_path=hot_path,
        errors=errors,
        wall_s=time.monotonic() - start,
        quick=quick,
    )


def _agent_probes_run(
    out_dir: Path, quick: bool, peak: float, errors: dict[str, str], log: IO[str]
) -> tuple[Any, Any, Any]:
    """The agent against CUDA events (`_agent_probes`) on one device and one NCCL group. `peak`:
    the peak both MFUs divide by (the table's, else a nominal 1 PFLOP/s: the check is a ratio)."""
    from mfuscope.agent import Agent

    gpu: Any = _guarded(
        "device for the agent probes",
        lambda: _agent_probes.CudaGpu(size=8192, comm_bytes=(1 if quick else 2) << 30),
        errors,
        log,
    )
    if gpu is None:
        for name in ("MFU ground truth", "breakdown", "hot path cost"):
            errors[name] = errors["device for the agent probes"]
        return None, None, None
    try:
        mfu_truth = _guarded(
            "MFU ground truth",
            lambda: _agent_probes.mfu_truth(
                gpu, Agent, out_dir, steps=20 if quick else 40, chain=8, peak=peak
            ),
            errors,
            log,
        )
        breakdown = _guarded(
            "breakdown",
            lambda: _agent_probes.breakdown_truth(
                gpu,
                Agent,
                out_dir,
                gemms=2,
                gap_s=0.002,
                carried_steps=20 if quick else 40,
                peak=peak,
            ),
            errors,
            log,
        )
        hot_path = _guarded(
            "hot path cost",
            lambda: _agent_probes.hot_path_cost(
                gpu, Agent, out_dir, rounds=100 if quick else 200, block=20
            ),
            errors,
            log,
        )
    finally:
        gpu.close()
    return mfu_truth, breakdown, hot_path
