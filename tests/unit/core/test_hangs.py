"""Hang and desync attribution from the ranks' progress reports."""

from __future__ import annotations

from mfuscope.core.collective_records import GroupProgress, PendingCollective
from mfuscope.core.hangs import BLOCKED_AFTER_S, BlockedOp, RankComm, Suspect, find_hangs


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
