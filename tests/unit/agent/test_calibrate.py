"""CPU peak calibration: a real short matmul measurement, its loop under a fake clock, its rounds,
and the cached figure keyed on this machine."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from mfuscope.agent.calibrate import (
    cached_cpu_peak,
    calibrate_cpu_peak,
    calibration_key,
    measure_cpu_peak_flops,
    measured_cpu_peak,
)


def test_real_measurement_is_plausible() -> None:
    peak = measure_cpu_peak_flops("fp32", seconds=0.05, matrix_size=256)
    # Anything that runs torch does more than 0.1 GFLOP/s and less than a GPU's 1 PFLOP/s.
    assert math.isfinite(peak)
    assert 1e8 < peak < 1e15


def test_measured_lookup_is_labelled_measured() -> None:
    found = measured_cpu_peak("bf16", seconds=0.02)
    assert found.source == "measured"
    assert found.device_key == "cpu"
    assert found.peak_flops is not None and found.peak_flops > 0
    assert "not a spec" in found.message


class StepClock:
    """Advances by a fixed tick at every read: each timed batch then lasts exactly one tick."""

    def __init__(self, tick_s: float) -> None:
        self.now = 0.0
        self.tick_s = tick_s

    def __call__(self) -> float:
        self.now += self.tick_s
        return self.now


def test_loop_under_a_fake_clock() -> None:
    # 4 matmuls of 8 x 8 per batch = 4 * 2 * 8^3 FLOPs in 1 ms each: 4.096 MFLOP/s.
    clock = StepClock(1e-3)
    peak = measure_cpu_peak_flops("fp32", seconds=0.01, matrix_size=8, clock=clock)
    assert peak == pytest.approx(4 * 2 * 8**3 / 1e-3)
    # the loop stops at the first check past the deadline (read at 1 ms, so due at 11 ms);
    # each batch reads the clock three times (start, end, deadline check)
    assert 0.011 <= clock.now <= 0.011 + 3e-3


def test_tiny_budget_still_runs_one_batch() -> None:
    clock = StepClock(1.0)
    assert measure_cpu_peak_flops(seconds=1e-9, matrix_size=4, clock=clock) == pytest.approx(
        4 * 2 * 4**3 / 1.0
    )


@pytest.mark.parametrize(
    "kwargs",
    [{"dtype": "fp8"}, {"dtype": "int8"}, {"seconds": 0.0}, {"matrix_size": 0}],
)
def test_bad_arguments(kwargs: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        measure_cpu_peak_flops(**kwargs)  # type: ignore[arg-type]


def test_rounds_keep_the_best_rate_and_their_spread() -> None:
    rates = iter([80e9, 100e9, 90e9, 95e9])
    asked: list[tuple[str, float]] = []

    def measure(dtype: str, seconds: float) -> float:
        asked.append((dtype, seconds))
        return next(rates)

    found = calibrate_cpu_peak("fp32", seconds=2.0, rounds=4, measure=measure)
    assert (found.peak_flops, found.rounds, found.seconds) == (100e9, 4, 2.0)
    assert found.spread_ratio == pytest.approx(0.2)
    assert asked == [("fp32", 0.5)] * 4


def test_cached_peak_is_measured_once_per_key(tmp_path: Path) -> None:
    first = cached_cpu_peak("fp32", cache_dir=tmp_path, seconds=0.02, rounds=2)
    again = cached_cpu_peak("tf32", cache_dir=tmp_path, seconds=0.02, rounds=2)  # fp32 on a CPU
    assert (first.cached, again.cached) == (False, True)
    assert again.peak_flops == first.peak_flops
    key = calibration_key("fp32", 0.02, 2)
    assert first.key == key and key.threads >= 1 and key.cpus >= 1 and "torch" in key.method
    assert calibration_key("fp32", 0.02, 2, threads=key.threads + 1) != key
    with pytest.raises(ValueError):
        cached_cpu_peak("fp8", cache_dir=tmp_path)
