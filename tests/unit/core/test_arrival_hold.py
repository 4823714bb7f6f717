"""Which arrival sample a collector holds for the cross-collector rules (core.arrivals)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st
from mfuscope.core.arrivals import replaces_held

MINUTE_NS = 60_000_000_000


def test_the_first_sample_of_a_later_period_replaces_the_held_one() -> None:
    held = 29_000 * MINUTE_NS + 5  # early in a minute
    assert replaces_held(None, held, 60.0)
    assert not replaces_held(held, held + MINUTE_NS - 10, 60.0)  # same minute
    assert replaces_held(held, 29_001 * MINUTE_NS, 60.0)  # the next minute's first instant
    assert not replaces_held(held, held - 1, 60.0)


@given(
    st.lists(st.integers(0, 10 * MINUTE_NS), min_size=1, max_size=40).map(sorted),
    st.integers(-MINUTE_NS // 100, MINUTE_NS // 100),
)
def test_ranks_hold_the_same_collective_unless_a_boundary_splits_it(
    times: list[int], skew: int
) -> None:
    # Two ranks enqueue the same collectives, the second `skew` ns later: they hold the same one
    # in the end unless a period boundary falls between their enqueue times of a collective.
    def hold(offsets: list[int]) -> int:
        held: int | None = None
        index = -1
        for i, t in enumerate(offsets):
            if replaces_held(held, t, 60.0):
                held, index = t, i
        return index

    base = 1_000 * MINUTE_NS
    first = hold([base + t for t in times])
    second = hold([base + t + skew for t in times])
    split = any((base + t) // MINUTE_NS != (base + t + skew) // MINUTE_NS for t in times)
    assert first == second or split
