"""busbw over many calls: one aggregation (Σ bus bytes / Σ seconds of the calls of known size),
and its efficiency against the tier's spec (docs/definitions.md#aggregating-busbw)."""

from __future__ import annotations

import math
import random

import pytest
from hypothesis import given
from hypothesis import strategies as st
from mfuscope.core.bandwidth import (
    aggregate_busbw_bytes_per_s,
    bus_factor,
    busbw_bytes_per_s,
    busbw_efficiency,
)

_CALL = st.tuples(
    st.sampled_from(["all_reduce", "all_gather", "broadcast"]),
    st.integers(2, 64),
    st.floats(1.0, 1e10),  # S, bytes
    st.floats(1e-6, 10.0),  # t, s
)


@given(st.lists(_CALL, min_size=1, max_size=30), st.randoms())
def test_the_aggregate_is_the_time_weighted_mean_of_the_calls_busbw(
    calls: list[tuple[str, int, float, float]], rng: random.Random
) -> None:
    bus_bytes = math.fsum(s * bus_factor(op, n) for op, n, s, _ in calls)
    seconds = math.fsum(t for *_, t in calls)
    aggregate = aggregate_busbw_bytes_per_s(bus_bytes, seconds)
    weighted = math.fsum(busbw_bytes_per_s(op, n, s, t) * t for op, n, s, t in calls) / seconds
    assert aggregate == pytest.approx(weighted, rel=1e-9)
    # Summed in any order or in parts (ranks, collectors), the same figure.
    rng.shuffle(calls)
    half = len(calls) // 2
    parts = [calls[:half], calls[half:]]
    again = aggregate_busbw_bytes_per_s(
        math.fsum(s * bus_factor(op, n) for part in parts for op, n, s, _ in part),
        math.fsum(t for part in parts for *_, t in part),
    )
    assert again == pytest.approx(aggregate, rel=1e-12)


def test_it_is_not_the_mean_of_the_calls_busbw() -> None:
    # 1 GB in 1 s and 1 GB in 9 s (broadcast, factor 1): 2 GB in 10 s, not (1 + 1/9) / 2 GB/s.
    assert aggregate_busbw_bytes_per_s(2e9, 10.0) == 2e8


def test_no_time_no_busbw() -> None:
    assert aggregate_busbw_bytes_per_s(0.0, 0.0) is None


@pytest.mark.parametrize(
    ("busbw", "spec", "expected"),
    [(4e10, 5e10, 0.8), (None, 5e10, None), (4e10, None, None), (4e10, 0.0, None)],
)
def test_efficiency_is_busbw_over_the_spec_when_both_are_known(
    busbw: float | None, spec: float | None, expected: float | None
) -> None:
    assert busbw_efficiency(busbw, spec) == expected
