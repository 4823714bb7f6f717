"""The alpha-beta fit against known truths (core/comm_fit.py)."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from mfuscope.core.bandwidth import LinkModel, ideal_transfer_s
from mfuscope.core.comm_fit import fit_alpha_beta

SIZES = [float(2**k) for k in range(10, 29, 2)]  # 1 KiB .. 256 MiB


def _times(link: LinkModel, sizes: list[float]) -> list[float]:
    return [ideal_transfer_s(link, s) for s in sizes]


@pytest.mark.parametrize(
    ("alpha_s", "beta_bytes_per_s"),
    [
        (25e-6, 2.0e10),  # an InfiniBand-like tier
        (3e-6, 3.6e11),  # an NVLink-like tier
        (5e-5, 1.2e9),  # gloo over loopback TCP, roughly
        (0.0, 5.0e10),  # no latency at all
    ],
)
def test_exact_points_recover_the_truth(alpha_s: float, beta_bytes_per_s: float) -> None:
    truth = LinkModel(alpha_s, beta_bytes_per_s)
    fit = fit_alpha_beta(SIZES, _times(truth, SIZES))
    assert fit is not None
    assert fit.link.alpha_s == pytest.approx(alpha_s, rel=1e-7, abs=1e-12)
    assert fit.link.beta_bytes_per_s == pytest.approx(beta_bytes_per_s, rel=1e-7)
    assert fit.rms_relative_error == pytest.approx(0.0, abs=1e-9)
    assert fit.points == len(SIZES)
    assert fit.half_bandwidth_bytes == pytest.approx(alpha_s * beta_bytes_per_s, rel=1e-6, abs=1e-3)


def test_noisy_points_land_near_the_truth() -> None:
    truth = LinkModel(20e-6, 1e10)
    # Deterministic +-4 % multiplicative noise, alternating in sign.
    times = [t * (1.04 if i % 2 else 0.96) for i, t in enumerate(_times(truth, SIZES))]
    fit = fit_alpha_beta(SIZES, times)
    assert fit is not None
    assert fit.link.alpha_s == pytest.approx(20e-6, rel=0.1)
    assert fit.link.beta_bytes_per_s == pytest.approx(1e10, rel=0.1)
    assert 0.02 < fit.rms_relative_error < 0.06


def test_small_messages_are_not_drowned_by_large_ones() -> None:
    # The relative-error weighting: a 10x latency error on the small points must be visible in
    # alpha even though the large points' absolute times are a million times longer.
    truth = LinkModel(1e-5, 1e10)
    fit = fit_alpha_beta(SIZES, _times(truth, SIZES))
    slower = fit_alpha_beta(SIZES, _times(LinkModel(1e-4, 1e10), SIZES))
    assert fit is not None and slower is not None
    assert slower.link.alpha_s == pytest.approx(10 * fit.link.alpha_s, rel=1e-6)


def test_a_negative_intercept_is_clamped_to_zero() -> None:
    # Time grows with size but extrapolates below zero at size 0: no physical latency.
    sizes = [1e6, 2e6, 4e6]
    times = [s / 1e9 - 1e-4 for s in sizes]
    fit = fit_alpha_beta(sizes, times)
    assert fit is not None
    assert fit.link.alpha_s == 0.0
    assert fit.link.beta_bytes_per_s > 1e9  # the origin fit is steeper than the data's slope


@pytest.mark.parametrize(
    ("sizes", "times", "why"),
    [
        ([], [], "no points"),
        ([1e6], [1e-3], "one point"),
        ([1e6, 1e6, 1e6], [1e-3, 2e-3, 3e-3], "one size only"),
        ([1e3, 1e6, 1e9], [3e-3, 2e-3, 1e-3], "time falls with size"),
        ([1e3, 1e6], [0.0, 0.0], "no positive time"),
    ],
)
def test_unfittable_inputs_give_none(sizes: list[float], times: list[float], why: str) -> None:
    assert fit_alpha_beta(sizes, times) is None, why


def test_mismatched_lengths_raise() -> None:
    with pytest.raises(ValueError, match="sizes"):
        fit_alpha_beta([1.0, 2.0], [1.0])
    with pytest.raises(ValueError, match="weights"):
        fit_alpha_beta([1.0, 2.0], [1.0, 2.0], [1.0])


def test_weights_act_like_repeated_points() -> None:
    sizes = [1e4, 1e5, 1e6, 1e7]
    times = [3e-5, 4e-5, 1.5e-4, 1.1e-3]
    weighted = fit_alpha_beta(sizes, times, [1.0, 3.0, 1.0, 2.0])
    repeated = fit_alpha_beta(
        [1e4, 1e5, 1e5, 1e5, 1e6, 1e7, 1e7], [3e-5, 4e-5, 4e-5, 4e-5, 1.5e-4, 1.1e-3, 1.1e-3]
    )
    assert weighted is not None and repeated is not None
    assert weighted.link.alpha_s == pytest.approx(repeated.link.alpha_s, rel=1e-9)
    assert weighted.link.beta_bytes_per_s == pytest.approx(repeated.link.beta_bytes_per_s, rel=1e-9)


@settings(max_examples=200, deadline=None)
@given(
    alpha_s=st.floats(1e-7, 1e-3),
    beta=st.floats(1e8, 1e12),
    exponents=st.lists(st.integers(0, 32), min_size=2, max_size=12, unique=True),
)
def test_any_exact_model_is_recovered(alpha_s: float, beta: float, exponents: list[int]) -> None:
    sizes = [float(2**e) for e in exponents]
    truth = LinkModel(alpha_s, beta)
    fit = fit_alpha_beta(sizes, _times(truth, sizes))
    assert fit is not None
    # Through the fitted model, every point's time is reproduced (whatever the conditioning).
    for size in sizes:
        assert ideal_transfer_s(fit.link, size) == pytest.approx(
            ideal_transfer_s(truth, size), rel=1e-6
        )
    assert math.isfinite(fit.rms_relative_error) and fit.rms_relative_error < 1e-6


@settings(max_examples=100, deadline=None)
@given(
    sizes=st.lists(st.floats(0, 1e10), min_size=2, max_size=10),
    times=st.lists(st.floats(1e-7, 10.0), min_size=10, max_size=10),
)
def test_any_fit_is_physical(sizes: list[float], times: list[float]) -> None:
    fit = fit_alpha_beta(sizes, times[: len(sizes)])
    if fit is not None:
        assert fit.link.alpha_s >= 0
        assert fit.link.beta_bytes_per_s > 0
