"""The job-time ledger's definitions: a region split between its phases and its owner, one rank's
batches booked into categories (steps, the agent's totals, hung as a debt, down at a restart),
exact in integer nanoseconds, and effective MFU."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from mfuscope.core.collective_records import GroupProgress, PendingCollective
from mfuscope.core.ledger import (
    AGENT_CATEGORIES,
    CATEGORIES,
    PHASES,
    LedgerTotals,
    ProcessTime,
    book_batch,
    effective_mfu,
    phase_category,
    rank_hang,
    split_region,
    wall_ns,
)

S = 1_000_000_000  # ns


def _totals(start: int, **ns: int) -> LedgerTotals:
    return LedgerTotals(process_start_unix_ns=start, **{f"{k}_ns": v for k, v in ns.items()})


def _waiting(waited_s: float, seq: int = 7, group: str = "0") -> list[GroupProgress]:
    return [
        GroupProgress(
            group=group,
            axis="dp",
            tier="intra_node",
            size=2,
            entered_seq=seq,
            completed_seq=seq - 1,
            pending=PendingCollective(seq=seq, op="all_reduce", waited_s=waited_s),
        ),
        GroupProgress(group="9", axis="tp", tier="intra_node", entered_seq=3, completed_seq=3),
    ]


def test_the_vocabulary() -> None:
    assert set(AGENT_CATEGORIES) | {"step", "redone_step", "hung", "down"} == set(CATEGORIES)
    assert len(CATEGORIES) == 10 and set(PHASES) < set(CATEGORIES)
    assert phase_category("evaluation") == "evaluation"
    assert phase_category("checkpoint_save") == "checkpoint_save"
    assert phase_category("Evaluation") == phase_category("logging") == "other_phase"


@pytest.mark.parametrize(
    ("phases", "rest", "booked"),
    [
        ((), 100, ()),
        (((10, 30, "evaluation"),), 80, (("evaluation", 20),)),
        # clipped to the region
        (
            ((-50, 10, "checkpoint_load"), (90, 200, "other_phase")),
            80,
            (("checkpoint_load", 10), ("other_phase", 10)),
        ),
        # overlap: the earlier phase keeps it; a phase inside another counts nothing
        (((10, 50, "evaluation"), (20, 40, "checkpoint_save")), 60, (("evaluation", 40),)),
        (
            ((10, 50, "evaluation"), (40, 70, "other_phase")),
            40,
            (("evaluation", 40), ("other_phase", 20)),
        ),
    ],
)
def test_split_region(
    phases: tuple[tuple[int, int, str], ...], rest: int, booked: tuple[tuple[str, int], ...]
) -> None:
    assert split_region(0, 100, phases) == (rest, booked)


@given(
    st.integers(0, 10**6),
    st.integers(0, 10**6),
    st.lists(
        st.tuples(st.integers(-10, 2 * 10**6), st.integers(0, 10**6), st.sampled_from(PHASES))
    ),
)
def test_a_region_splits_exactly_into_its_owner_and_phases(
    start: int, length: int, spans: list[tuple[int, int, str]]
) -> None:
    phases = sorted((s, s + d, c) for s, d, c in spans)
    rest, booked = split_region(start, start + length, phases)
    assert rest >= 0 and all(ns > 0 for _, ns in booked)
    assert rest + sum(ns for _, ns in booked) == length


def test_wall_ns_gives_back_the_nanoseconds_a_period_was_made_of() -> None:
    for ns in (1_000, 123_456_789, 86_399 * S + 999_999_999, 7 * S + 1):
        assert wall_ns(ns / 1e9) == ns


def test_steps_and_the_agents_totals_are_booked_and_a_resend_adds_nothing() -> None:
    first = _totals(100 * S, startup=5 * S)
    p, booked = book_batch(None, 0, first, [(2 * S, False), (2 * S, False)], [])
    assert booked == (("step", 2 * S), ("step", 2 * S), ("startup", 5 * S))
    again, booked = book_batch(p, 0, first)  # the same totals again
    assert booked == () and again == p
    later = _totals(100 * S, startup=5 * S, checkpoint_save=3 * S)
    p, booked = book_batch(p, 0, later, [(1 * S, True)])
    assert booked == (("redone_step", S), ("checkpoint_save", 3 * S))
    p, booked = book_batch(p, 0, first)  # an older batch, late: its smaller totals add nothing
    assert booked == ()
    assert p is not None and p.end_unix_ns == 100 * S + 13 * S


def test_an_agent_before_the_ledger_books_nothing() -> None:
    assert book_batch(None, 0, None, [(S, False)]) == (None, ())


def test_hung_is_counted_from_the_blocked_moment_and_taken_out_of_the_step_that_ends_it() -> None:
    start = _totals(0, startup=S)
    p, booked = book_batch(None, 0, start, [(S, False)], _waiting(4.0))
    assert booked == (("step", S), ("startup", S))  # 4 s of waiting: not blocked yet
    p, booked = book_batch(p, 0, start, [], _waiting(12.5))
    assert booked == (("hung", 2_500_000_000),)
    p, booked = book_batch(p, 0, start, [], _waiting(30.0))
    assert booked == (("hung", 17_500_000_000),)
    # it moved: the step it was in arrives, 31 s long; 20 s of it are hung already
    p, booked = book_batch(p, 0, start, [(31 * S, False)], _waiting(0.5, seq=8))
    assert booked == (("step", 11 * S),)
    assert p is not None and p.debt_ns == 0 and p.end_unix_ns == 33 * S


def test_a_new_hang_at_another_seq_counts_from_its_own_start() -> None:
    p, _ = book_batch(None, 0, _totals(0), [], _waiting(15.0, seq=7))
    p, booked = book_batch(p, 0, _totals(0), [], _waiting(11.0, seq=8))
    assert booked == (("hung", S),)
    p, booked = book_batch(p, 0, _totals(0), [], None)  # a batch without progress: as it was
    assert booked == ()
    p, booked = book_batch(p, 0, _totals(0), [], _waiting(12.0, seq=8))
    assert booked == (("hung", S),)


def test_rank_hang_takes_the_longest_wait() -> None:
    groups = _waiting(11.0, group="a") + _waiting(25.0, seq=3, group="b")
    assert rank_hang(groups) == (("b", 3), 15 * S)
    assert rank_hang(_waiting(9.0)) is None
    assert rank_hang([]) is None


def test_a_replacement_books_down_from_the_end_of_the_old_process() -> None:
    old = _totals(0, startup=2 * S)
    p, _ = book_batch(None, 0, old, [(S, False)] * 5)
    assert p is not None and p.end_unix_ns == 7 * S
    # the old process died in a hang: 3 s hung, never paid by a step
    p, _ = book_batch(p, 0, old, [], _waiting(13.0))
    assert p is not None and p.end_unix_ns == 10 * S
    new = _totals(25 * S, startup=4 * S)
    p, booked = book_batch(p, 1, new, [(S, True), (S, False)])
    assert booked == (("down", 15 * S), ("redone_step", S), ("step", S), ("startup", 4 * S))
    assert p is not None and p.launch == 1 and p.end_unix_ns == 31 * S
    # a late batch of the old process: its time was counted as down
    assert book_batch(p, 0, _totals(0, startup=2 * S), [(S, False)]) == (p, ())


def test_a_replacement_that_overlaps_the_old_process_books_no_down() -> None:
    p, _ = book_batch(None, 0, _totals(0, startup=10 * S))
    p, booked = book_batch(p, 1, _totals(5 * S, startup=S))
    assert booked == (("startup", S),)


_BATCHES = st.lists(
    st.tuples(
        st.integers(0, 2),  # launch offset
        st.lists(st.tuples(st.integers(1, 3 * S), st.booleans()), max_size=4),
        st.lists(st.integers(0, 4 * S), min_size=6, max_size=6),  # totals growth
        st.one_of(st.none(), st.floats(0.0, 60.0), st.just(-1.0)),  # waited, -1: no progress
        st.integers(0, 50 * S),  # a replacement's start after the old one's end
    ),
    max_size=12,
)


@given(_BATCHES)
def test_a_rank_books_exactly_the_span_from_its_first_start_to_its_last_end(
    batches: list[tuple[int, list[tuple[int, bool]], list[int], float | None, int]],
) -> None:
    p: ProcessTime | None = None
    launch, totals, start = 0, [0] * 6, 1_000 * S
    first_start: int | None = None
    booked_total = 0
    for jump, steps, growth, waited, gap in batches:
        if jump and p is not None:
            launch += jump
            start, totals = p.end_unix_ns + gap, [0] * 6
        totals = [t + g for t, g in zip(totals, growth, strict=True)]
        ledger = LedgerTotals(
            process_start_unix_ns=start,
            **{f"{c}_ns": t for c, t in zip(AGENT_CATEGORIES, totals, strict=True)},
        )
        groups = None if waited == -1.0 else ([] if waited is None else _waiting(waited))
        p, booked = book_batch(p, launch, ledger, steps, groups)
        assert all(ns > 0 and c in CATEGORIES for c, ns in booked)
        booked_total += sum(ns for _, ns in booked)
        first_start = start if first_start is None else first_start
    if p is not None and first_start is not None:
        assert booked_total == p.end_unix_ns - first_start


def test_effective_mfu_is_useful_flops_over_peak_times_every_rank_second() -> None:
    assert effective_mfu(4.5e14, 1e15) == pytest.approx(0.45)
    assert effective_mfu(1.0, 0.0) is None
