"""MFU / HFU formulas and the waterfall identity (docs/definitions.md#why-the-waterfall-holds)."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st
from mfuscope.core.mfu import (
    StepBuckets,
    achieved_flops_per_s,
    hfu,
    mfu,
    mfu_waterfall,
)


def test_mfu_definition_seed_a100_example() -> None:
    # ml-engineering glossary (seed): "mfu=0.5 at half-precision on A100 comes from getting
    # 156TFLOPs, because peak half-precision spec is 312TFLOPS".
    assert mfu(156e12, 312e12, 1.0) == pytest.approx(0.5)
    assert achieved_flops_per_s(156e12 * 3, 3.0) == pytest.approx(156e12)


def test_hfu_adds_recompute() -> None:
    assert hfu(6e12, 2e12, 1e13, 1.0) == pytest.approx(0.8)
    assert mfu(6e12, 1e13, 1.0) == pytest.approx(0.6)


@pytest.mark.parametrize(
    "args",
    [(1e12, 0.0, 1.0), (1e12, -1.0, 1.0), (1e12, 1e12, 0.0), (-1.0, 1e12, 1.0),
     (math.nan, 1e12, 1.0), (1e12, math.inf, 1.0)],
)  # fmt: skip
def test_mfu_rejects_nonsense(args: tuple[float, float, float]) -> None:
    with pytest.raises(ValueError):
        mfu(*args)


def test_waterfall_worked_example() -> None:
    # A 1 s window: 0.6 s compute, 0.1 s recompute, 0.15 s exposed comm, 0.05 s memcpy,
    # 0.06 s pipeline bubble, 0.04 s idle; model FLOPs 3e14 on a 1e15 FLOP/s device.
    buckets = StepBuckets(0.6, 0.1, 0.15, 0.05, 0.06, 0.04)
    w = mfu_waterfall(3e14, 1e15, buckets)
    assert w.window_s == pytest.approx(1.0)
    assert w.mfu == pytest.approx(0.3)
    assert w.kernel_efficiency == pytest.approx(0.5)
    assert w.kernel_inefficiency == pytest.approx(0.3)
    assert w.bubble == pytest.approx(0.1)
    assert w.mfu + sum(w.slices().values()) == pytest.approx(1.0)


def test_waterfall_splits_the_kernel_slice_by_elementwise_time() -> None:
    # The worked example with 0.2 s of the 0.6 s compute in elementwise/norm/reduce kernels:
    # f_elementwise = 0.2, and the rest of the 0.3 kernel slice is 0.1.
    buckets = StepBuckets(0.6, 0.1, 0.15, 0.05, 0.06, 0.04, elementwise_s=0.2)
    w = mfu_waterfall(3e14, 1e15, buckets)
    assert w.window_s == pytest.approx(1.0)  # elementwise time is inside compute, not beside it
    assert (w.elementwise, w.kernel_inefficiency) == (pytest.approx(0.2), pytest.approx(0.1))
    assert w.mfu + sum(w.slices().values()) == pytest.approx(1.0)
    with pytest.raises(ValueError, match="part of compute_s"):
        StepBuckets(0.6, elementwise_s=0.7)


def test_waterfall_without_compute() -> None:
    w = mfu_waterfall(0.0, 1e15, StepBuckets(0.0, bubble_idle_s=2.0))
    assert w.kernel_efficiency is None
    assert w.mfu == 0.0
    assert w.bubble_idle == pytest.approx(1.0)
    # FLOPs counted in a window without compute: no efficiency, and the kernel slice shows the
    # disagreement as -MFU so the slices still sum to 1.
    w = mfu_waterfall(1e12, 1e15, StepBuckets(0.0, exposed_comm_s=1.0))
    assert w.kernel_efficiency is None
    assert w.kernel_inefficiency == pytest.approx(-1e-3)
    assert w.mfu + sum(w.slices().values()) == pytest.approx(1.0)


def test_waterfall_keeps_an_impossible_kernel_efficiency_visible() -> None:
    # FLOPs (or the peak) overstated: the kernels "beat" the peak; the slice goes negative.
    w = mfu_waterfall(2e15, 1e15, StepBuckets(1.0, exposed_comm_s=1.0))
    assert w.kernel_efficiency == pytest.approx(2.0)
    assert w.kernel_inefficiency < 0
    assert w.mfu + sum(w.slices().values()) == pytest.approx(1.0)


def test_empty_window_is_rejected() -> None:
    with pytest.raises(ValueError):
        StepBuckets(0.0)
    with pytest.raises(ValueError):
        StepBuckets(-1.0, 2.0)


seconds = st.floats(0.0, 10.0, allow_nan=False)


@given(
    st.tuples(seconds, seconds, seconds, seconds, seconds, seconds).filter(lambda b: b[0] > 1e-6),
    st.floats(0.0, 1.0),
    st.floats(1e12, 1e16),
)
def test_waterfall_identity(
    parts: tuple[float, ...], kernel_efficiency: float, peak: float
) -> None:
    buckets = StepBuckets(*parts, elementwise_s=parts[0] * kernel_efficiency)
    model_flops = kernel_efficiency * peak * buckets.compute_s
    w = mfu_waterfall(model_flops, peak, buckets)
    assert w.mfu + sum(w.slices().values()) == pytest.approx(1.0, abs=1e-9)
    assert w.mfu == pytest.approx(mfu(model_flops, peak, buckets.window_s), rel=1e-12, abs=1e-15)
    assert 0.0 <= w.mfu <= 1.0 + 1e-12


@given(
    st.floats(0.0, 1e18),
    st.floats(0.0, 1e18),
    st.floats(1e9, 1e16),
    st.floats(1e-6, 1e4),
)
def test_mfu_never_exceeds_hfu(model: float, recompute: float, peak: float, wall: float) -> None:
    assert mfu(model, peak, wall) <= hfu(model, recompute, peak, wall)
