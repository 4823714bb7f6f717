"""Hang and desync attribution from the ranks' progress reports."""

from __future__ import annotations

import dataclasses

import msgspec
from mfuscope.core.collective_records import GroupProgress, PendingCollective
from mfuscope.core.hangs import (
    BLOCKED_AFTER_S,
    OVERDUE_AFTER_S,
    BlockedOp,
    GroupWait,
    ProgressExport,
    RankComm,
    RankProgress,
    Suspect,
    find_hangs,
    progress_export,
    step_overdue,
)


def _group(
    name: str,
    entered: int,
    *,
    axis: str = "dp",
    pending: tuple[int, str, float] | None = None,
) -> GroupProgress:
    return GroupProgress(
        group=name,
        axis=axis,
        tier="inter_node",
        size=4,
        entered_seq=entered,
        completed_seq=entered - (1 if pending else 0),
        pending=None
        if pending is None
        else PendingCollective(seq=pending[0], op=pending[1], bytes=64, waited_s=pending[2]),
    )


def _rank(rank: int, *groups: GroupProgress, age_s: float = 2.0, closed: bool = False) -> RankComm:
    return RankComm(rank, f"h{rank}", f"n{rank // 2}", groups, age_s, 10.0, closed)


def test_the_rank_that_never_joined_is_the_suspect() -> None:
    waiting = [_rank(r, _group("3", 4812, pending=(4812, "all_reduce", 92.0))) for r in (0, 1, 3)]
    view = find_hangs([*waiting, _rank(2, _group("3", 4811))])
    assert view.blocked == (BlockedOp("dp", "inter_node", "all_reduce", 3, 94.0),)
    assert view.suspects == (
        Suspect(2, "h2", "n1", "all_reduce", 4812, "dp", "inter_node", "not_joined", 3, 94.0),
    )
    assert view.suspects_total == 1


def test_short_waits_closed_agents_and_stale_reports_are_not_blocked() -> None:
    short = BLOCKED_AFTER_S - 3.0
    assert (
        find_hangs(
            [_rank(0, _group("3", 5, pending=(5, "all_reduce", short))), _rank(1, _group("3", 4))]
        ).blocked
        == ()
    )
    closed = _rank(0, _group("3", 5, pending=(5, "all_reduce", 50.0)), closed=True)
    assert find_hangs([closed, _rank(1, _group("3", 4))]).blocked == ()
    # A status three reporting intervals old: the rank's process is likely gone.
    stale = _rank(0, _group("3", 5, pending=(5, "all_reduce", 50.0)), age_s=31.0)
    assert find_hangs([stale, _rank(1, _group("3", 4))]).blocked == ()


def test_a_victim_waiting_elsewhere_points_at_the_root() -> None:
    # Rank 2 stopped: rank 0 waits for it on dp group "a"; rank 1 waits on tp group "b" for
    # rank 0, who never joined "b" #9 because it waits in "a". The cause is rank 2, not rank 0.
    ranks = [
        _rank(0, _group("a", 7, pending=(7, "all_reduce", 40.0)), _group("b", 8, axis="tp")),
        _rank(1, _group("b", 9, axis="tp", pending=(9, "all_gather", 30.0))),
        _rank(2, _group("a", 6)),
    ]
    view = find_hangs(ranks)
    assert [(s.rank, s.reason, s.op, s.seq, s.axis) for s in view.suspects] == [
        (2, "not_joined", "all_reduce", 7, "dp")
    ]
    assert {b.axis for b in view.blocked} == {"dp", "tp"}


def test_a_cycle_is_a_desync() -> None:
    # Ranks 0 and 1 call the collectives of groups "a" and "b" in opposite orders.
    ranks = [
        _rank(0, _group("a", 3, pending=(3, "all_reduce", 20.0)), _group("b", 2)),
        _rank(1, _group("b", 3, pending=(3, "all_reduce", 20.0)), _group("a", 2)),
    ]
    view = find_hangs(ranks)
    assert sorted((s.rank, s.reason) for s in view.suspects) == [(0, "desync"), (1, "desync")]


def test_different_ops_at_one_sequence_number_are_a_desync() -> None:
    ranks = [_rank(r, _group("t", 77, pending=(77, "all_gather", 30.0))) for r in range(3)]
    ranks.append(_rank(3, _group("t", 77, pending=(77, "broadcast", 30.0))))
    view = find_hangs(ranks)
    assert [(s.rank, s.reason, s.op, s.seq) for s in view.suspects] == [
        (3, "desync", "all_gather", 77)
    ]


def test_suspects_are_capped_with_the_total_kept() -> None:
    waiting = [_rank(0, _group("g", 10, pending=(10, "all_reduce", 60.0)))]
    behind = [_rank(r, _group("g", 9)) for r in range(1, 21)]
    view = find_hangs([*waiting, *behind], max_suspects=4)
    assert [s.rank for s in view.suspects] == [1, 2, 3, 4]
    assert view.suspects_total == 20


def test_a_stale_rank_that_never_joined_is_still_named() -> None:
    # The suspect's process died: its last report (a minute old) says it entered up to #5.
    dead = _rank(1, _group("g", 5), age_s=60.0)
    view = find_hangs([_rank(0, _group("g", 6, pending=(6, "all_reduce", 45.0))), dead])
    assert [(s.rank, s.reason) for s in view.suspects] == [(1, "not_joined")]


def test_step_overdue_waits_for_the_longer_of_the_floor_and_three_steps() -> None:
    assert not step_overdue(None, 1.0)  # no step yet
    assert not step_overdue(OVERDUE_AFTER_S, 0.5)
    assert step_overdue(OVERDUE_AFTER_S + 0.1, 0.5)
    assert step_overdue(OVERDUE_AFTER_S + 0.1, None)
    assert not step_overdue(OVERDUE_AFTER_S + 0.1, 30.0)  # a 30 s step: 90 s
    assert step_overdue(90.1, 30.0)


def test_progress_export_waits_and_the_overdue_ranks_that_are_not_blocked() -> None:
    # One sidecar's view: ranks 0 and 1 wait in dp #4812; rank 1 also lags in group "7" where it
    # waits for nothing (a victim there); rank 2 is not blocked and is overdue: its progress goes
    # out, in every group of more than one rank; rank 4 closed.
    dp = ("3", 4812)
    waiting = [
        _rank(0, _group(*dp, pending=(4812, "all_reduce", 92.0))),
        _rank(1, _group(*dp, pending=(4812, "all_reduce", 40.0)), _group("7", 3)),
    ]
    single = msgspec.structs.replace(_group("solo", 9), size=1)
    stalled = dataclasses.replace(_rank(2, _group("3", 4811), single, _group("7", 5)), overdue=True)
    closed = _rank(4, _group("3", 4811), closed=True)
    export = progress_export([*waiting, stalled, closed])
    assert export.waits == (GroupWait("3", 4812, "all_reduce", "dp", "inter_node", 2, 94.0),)
    assert export.progress == (
        RankProgress(2, "h2", "n1", "3", "dp", "inter_node", 4811),
        RankProgress(2, "h2", "n1", "7", "dp", "inter_node", 5),
    )


def test_progress_export_is_empty_while_nothing_waits_or_is_overdue() -> None:
    healthy = [_rank(r, _group("3", 100, pending=(100, "all_reduce", 0.01))) for r in range(4)]
    assert progress_export(healthy) == ProgressExport((), ())
    # A stalled rank alone on its sidecar (its peers wait elsewhere): its progress goes out.
    alone = dataclasses.replace(_rank(5, _group("3", 99)), overdue=True)
    assert progress_export([alone]).progress == (
        RankProgress(5, "h5", "n2", "3", "dp", "inter_node", 99),
    )
