"""Runs the probes in order, each guarded: a probe that fails is recorded and the next one runs.

Budget (one H100): the full run takes a few minutes (the FLOP-counting step and the NCCL start-up
dominate), `--quick` about a minute; both stay well under 8 minutes. The flight-recorder probe adds
about 20 s either way: its deliberate stall must outlast the hang join's 10 s threshold.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any, TypeVar

from mfuscope.cli.validate_gpu import _flight, _probes
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
        errors=errors,
        wall_s=time.monotonic() - start,
        quick=quick,
    )
