"""The per-rank idempotency window: exact against a set-based model, bounded below the high step."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from mfuscope.collector._seen_steps import SeenSteps


@pytest.mark.parametrize(
    ("sent", "probe", "expected"),
    [
        ([], 0, True),
        ([5], 5, False),
        ([5], 4, True),
        ([5, 4], 4, False),
        ([5], 6, True),
        ([0, 10], 5, True),  # a gap below the high step is still new
        ([0, 10], 0, False),
        ([100], 100 - 8, False),  # width 8: more than 7 below the high step counts as seen
        ([100], 100 - 7, True),
        ([1, 10**15], 10**15 - 1, True),  # a huge jump does not build a huge mask
    ],
)
def test_is_new_table(sent: list[int], probe: int, expected: bool) -> None:
    window = SeenSteps(width=8)
    for step in sent:
        assert window.is_new(step)
        window.add(step)
    assert window.is_new(probe) is expected


def test_width_must_be_positive() -> None:
    with pytest.raises(ValueError, match="width"):
        SeenSteps(width=0)


@given(steps=st.lists(st.integers(min_value=0, max_value=300), max_size=200))
def test_matches_a_set_model_within_the_window(steps: list[int]) -> None:
    width = 64
    window = SeenSteps(width=width)
    seen: set[int] = set()
    for step in steps:
        high = max(seen, default=-1)
        expected = step not in seen and step > high - width
        assert window.is_new(step) is expected
        if expected:
            window.add(step)
            seen.add(step)
