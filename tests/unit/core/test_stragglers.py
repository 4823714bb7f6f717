"""Straggler ranking against the job median."""

from __future__ import annotations

import statistics

import pytest
from hypothesis import given
from hypothesis import strategies as st
from mfuscope.core.stragglers import find_stragglers


@pytest.mark.parametrize(
    ("times", "top", "expected"),
    [
        ({}, 3, []),
        ({0: 1.0}, 3, []),  # one rank: nothing to compare with
        ({0: 1.0, 1: 1.0}, 3, [(0, 1.0), (1, 1.0)]),
        ({0: 1.0, 1: 1.0, 2: 1.5}, 1, [(2, 1.5)]),
        ({0: 1.0, 1: 2.0, 2: 1.0, 3: 1.0}, 3, [(1, 2.0), (0, 1.0), (2, 1.0)]),
        ({0: 0.0, 1: 0.0}, 3, []),  # zero median
        ({0: 1.0, 1: 3.0}, 3, [(1, 1.5)]),  # even count: median is the mean of the middle two
    ],
)
def test_table(times: dict[int, float], top: int, expected: list[tuple[int, float]]) -> None:
    assert [(s.rank, s.ratio) for s in find_stragglers(times, top=top)] == expected


def test_negative_top_is_misuse() -> None:
    with pytest.raises(ValueError, match="top"):
        find_stragglers({0: 1.0}, top=-1)


@given(
    times=st.dictionaries(
        st.integers(0, 10_000), st.floats(0.001, 1000.0), min_size=2, max_size=50
    ),
    top=st.integers(0, 5),
)
def test_slowest_first_and_never_below_median(times: dict[int, float], top: int) -> None:
    found = find_stragglers(times, top=top)
    median = statistics.median(times.values())
    assert len(found) <= top
    assert all(s.ratio >= 1.0 and s.ratio == pytest.approx(s.step_s / median) for s in found)
    assert [s.step_s for s in found] == sorted((s.step_s for s in found), reverse=True)
    slowest = max(times.values())
    if top:
        assert found[0].step_s == slowest
