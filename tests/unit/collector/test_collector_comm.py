"""The collector on always-on collective records: traffic counters without double counting,
hang attribution series that appear and clear, normal ends, and arrival skew."""

from __future__ import annotations

import json
from typing import Any

import pytest
from mfuscope.collector import Aggregator, StateConfig
from mfuscope.core.hangs import OVERDUE_AFTER_S

from tests.support.collector_fakes import FakeClock, batch_dict, report_dict

OP = ("job-a", "all_reduce", "dp", "inter_node")
WINDOW_SAMPLE = {
    "op": "all_reduce",
    "axis": "dp",
    "tier": "inter_node",
    "group_size": 4,
    "bytes": 1000,
    "count": 2,
    "seconds": 0.5,
    "overlapped_s": 0.25,
}


def _traffic(calls: int, *, seconds: float = 0.0) -> dict[str, Any]:
    return {
        "op": "all_reduce",
        "axis": "dp",
        "tier": "inter_node",
        "group_size": 4,
        "calls": calls,
        "bytes": 1000 * calls,
        "seconds": seconds,
        "sized_seconds": seconds,
        "sized_bytes": 1000 * calls if seconds else 0,
    }


def _group(entered: int, pending: tuple[int, float] | None = None, size: int = 4) -> dict[str, Any]:
    group: dict[str, Any] = {
        "group": "3",
        "axis": "dp",
        "tier": "inter_node",
        "size": size,
        "entered_seq": entered,
        "completed_seq": entered - (1 if pending else 0),
    }
    if pending is not None:
        group["pending"] = {
            "seq": pending[0],
            "op": "all_reduce",
            "bytes": 4096,
            "waited_s": pending[1],
        }
    return group


def _comm(
    traffic: list[dict[str, Any]] | None = None,
    groups: list[dict[str, Any]] | None = None,
    *,
    durations: bool = False,
    arrivals: list[dict[str, Any]] | None = None,
    lost: int = 0,
) -> dict[str, Any]:
    return {
        "source": "flight_recorder",
        "durations": durations,
        "status_interval_s": 10.0,
        "lost_total": lost,
        "traffic": traffic or [],
        "groups": groups or [],
        "arrivals": arrivals or [],
    }


def _send(collector: Aggregator, rank: int = 0, **fields: Any) -> None:
    fields.setdefault("reports", [])
    body = batch_dict(rank=rank, world_size=4, host=f"h{rank}", node=f"n{rank // 2}", **fields)
    collector.ingest(json.dumps(body).encode())


def _series(collector: Aggregator, name: str) -> dict[tuple[str, ...], float]:
    for family in collector.families():
        if family.name == name:
            return {s.labels: s.value for s in family.samples}
    raise KeyError(name)


def _collective(collector: Aggregator, suffix: str) -> float:
    return _series(collector, f"mfuscope_collective_{suffix}_total")[OP]


def test_records_are_the_traffic_and_windows_add_only_what_they_alone_know() -> None:
    collector = Aggregator(StateConfig(), clock=FakeClock())
    windowed = [report_dict(1, collectives=[WINDOW_SAMPLE])]
    _send(collector, reports=windowed, comm=_comm([_traffic(10)]))
    # The profiled step's 2 calls are among the 10 the recorder saw: counted once.
    assert _collective(collector, "calls") == 10
    assert _collective(collector, "bytes") == 10_000
    assert _collective(collector, "bus_bytes") == pytest.approx(10_000 * 1.5)  # 2(n-1)/n, n = 4
    # gloo: no recorder durations, so the times and their busbw pair come from the window.
    assert _collective(collector, "seconds") == 0.5
    assert _collective(collector, "sized_seconds") == 0.5
    assert _collective(collector, "sized_bus_bytes") == pytest.approx(2000 * 1.5)
    assert _collective(collector, "overlapped_seconds") == 0.25
    assert _collective(collector, "profiled_seconds") == 0.5
    # Cumulative totals: a re-sent status adds nothing, the next one adds what grew.
    _send(collector, comm=_comm([_traffic(10)]))
    _send(collector, comm=_comm([_traffic(25)]))
    assert _collective(collector, "calls") == 25
    # A restarted agent's totals start again from zero: they count on top.
    _send(collector, comm=_comm([_traffic(4)]))
    assert _collective(collector, "calls") == 29


def test_recorder_durations_replace_the_windows_times() -> None:
    collector = Aggregator(StateConfig(), clock=FakeClock())
    windowed = [report_dict(1, collectives=[WINDOW_SAMPLE])]
    _send(collector, reports=windowed, comm=_comm([_traffic(10, seconds=2.0)], durations=True))
    assert _collective(collector, "seconds") == 2.0
    assert _collective(collector, "sized_seconds") == 2.0
    assert _collective(collector, "sized_bus_bytes") == pytest.approx(15_000)
    assert _collective(collector, "profiled_seconds") == 0.5  # the overlap's denominator


def test_gloo_send_recv_still_count_from_windows() -> None:
    # gloo's recorder has no point-to-point ops: the window's send samples count whole, its
    # all_reduce samples only in what windows alone know.
    send = {**WINDOW_SAMPLE, "op": "send", "axis": "pp", "group_size": 2}
    collector = Aggregator(StateConfig(), clock=FakeClock())
    windowed = [report_dict(1, collectives=[WINDOW_SAMPLE, send])]
    _send(collector, reports=windowed, comm=_comm([_traffic(10)]))
    calls = _series(collector, "mfuscope_collective_calls_total")
    assert calls == {OP: 10, ("job-a", "send", "pp", "inter_node"): 2}
    # NCCL records them: then the records are their source too.
    nccl = Aggregator(StateConfig(), clock=FakeClock())
    _send(nccl, reports=windowed, comm={**_comm([_traffic(10)]), "p2p_recorded": True})
    assert _series(nccl, "mfuscope_collective_calls_total")[OP] == 10
    assert (
        _series(nccl, "mfuscope_collective_calls_total")[("job-a", "send", "pp", "inter_node")] == 0
    )


def test_an_older_agent_still_counts_its_windows_whole() -> None:
    collector = Aggregator(StateConfig(), clock=FakeClock())
    _send(collector, reports=[report_dict(1, collectives=[WINDOW_SAMPLE])])
    assert _collective(collector, "calls") == 2
    assert _collective(collector, "seconds") == 0.5
    assert _collective(collector, "sized_bus_bytes") == pytest.approx(3000)


def test_a_hang_names_the_rank_and_clears_when_the_job_moves_on() -> None:
    clock = FakeClock()
    collector = Aggregator(StateConfig(), clock=clock)
    for rank in (0, 1, 3):
        _send(collector, rank, comm=_comm(groups=[_group(4812, (4812, 12.0))]))
    _send(collector, 2, comm=_comm(groups=[_group(4811)]))
    clock.advance(5.0)
    blocked = _series(collector, "mfuscope_collective_blocked_ranks")
    assert blocked == {("job-a", "dp", "inter_node", "all_reduce"): 3}
    waited = _series(collector, "mfuscope_collective_blocked_seconds")
    assert waited == {("job-a", "dp", "inter_node", "all_reduce"): pytest.approx(17.0)}
    suspects = _series(collector, "mfuscope_collective_hang_suspect_seconds")
    key = ("job-a", "2", "h2", "n1", "all_reduce", "4812", "dp", "inter_node", "not_joined")
    assert suspects == {key: pytest.approx(17.0)}
    assert _series(collector, "mfuscope_collective_hang_suspects") == {("job-a",): 1}
    # Rank 2 joins; everybody completes #4812: every series of the hang is gone.
    for rank in range(4):
        _send(collector, rank, comm=_comm(groups=[_group(4812)]))
    for name in ("blocked_ranks", "blocked_seconds", "hang_suspect_seconds", "hang_suspects"):
        assert _series(collector, f"mfuscope_collective_{name}") == {}


def test_closed_agents_end_the_report_age_and_wait_for_nothing() -> None:
    clock = FakeClock()
    collector = Aggregator(StateConfig(), clock=clock)
    for rank in range(2):
        _send(collector, rank, reports=[report_dict(1)], comm=_comm(groups=[_group(9)]))
    clock.advance(30)
    assert _series(collector, "mfuscope_last_report_age_seconds") == {("job-a",): 30.0}
    # An agent closing with a collective still open (a last barrier its peer skipped) is done.
    _send(collector, 0, closing=True, comm=_comm(groups=[_group(10, (10, 20.0))]))
    clock.advance(30)
    assert _series(collector, "mfuscope_last_report_age_seconds") == {("job-a",): 60.0}
    assert _series(collector, "mfuscope_collective_blocked_ranks") == {}
    _send(collector, 1, closing=True, comm=_comm(groups=[_group(10)]))
    clock.advance(200)
    assert _series(collector, "mfuscope_last_report_age_seconds") == {}
    assert _series(collector, "mfuscope_steps_total") == {("job-a",): 2.0}


def test_arrival_skew_and_the_late_rank() -> None:
    collector = Aggregator(StateConfig(), clock=FakeClock())
    base = 1_763_700_000_000_000_000
    late_ms = {0: 0, 1: 2, 2: 1, 3: 30}  # rank 3 enqueues 30 ms after rank 0
    for rank, ms in late_ms.items():
        arrivals = [{"group": "3", "seq": 100, "enqueued_unix_ns": base + ms * 1_000_000}]
        _send(collector, rank, comm=_comm(groups=[_group(100)], arrivals=arrivals))
    skew = _series(collector, "mfuscope_collective_arrival_skew_seconds")
    assert skew == {("job-a", "dp", "inter_node"): pytest.approx(0.030)}
    lateness = _series(collector, "mfuscope_collective_arrival_lateness_seconds")
    # Behind the median of 1.5 ms: rank 3 by 28.5 ms, rank 1 by 0.5 ms.
    assert lateness == {
        ("job-a", "3", "h3", "n1"): pytest.approx(0.0285),
        ("job-a", "1", "h1", "n0"): pytest.approx(0.0005),
    }


def test_lost_records_are_counted() -> None:
    collector = Aggregator(StateConfig(), clock=FakeClock())
    _send(collector, 0, comm=_comm(lost=7))
    _send(collector, 1, comm=_comm(lost=2))
    assert _series(collector, "mfuscope_collective_records_lost_total") == {("job-a",): 9.0}


def test_sidecars_export_what_the_hang_rule_joins() -> None:
    # Per-node sidecars: ranks 0, 1 and 3 report to `waiting`, rank 2 to `stalled`'s sidecar.
    # Rank 2 stops outside any collective; its sidecar sees nothing blocked and names nobody.
    clock = FakeClock()
    waiting = Aggregator(StateConfig(), clock=clock)
    stalled = Aggregator(StateConfig(), clock=clock)
    _send(stalled, 2, reports=[report_dict(1)], comm=_comm(groups=[_group(4811)]))
    for rank in (0, 1, 3):
        _send(
            waiting, rank, reports=[report_dict(1)], comm=_comm(groups=[_group(4812, (4812, 12.0))])
        )
    key = ("job-a", "3", "4812", "all_reduce", "dp", "inter_node")
    assert _series(waiting, "mfuscope_collective_group_waiting_seq") == {key: 4812.0}
    assert _series(waiting, "mfuscope_collective_group_waiting_seconds") == {key: 12.0}
    assert _series(waiting, "mfuscope_collective_hang_suspect_seconds") == {}
    # Rank 2's status keeps coming, its steps do not: before its step is overdue it exports no
    # progress (a healthy rank between two batches looks the same), after it does.
    clock.advance(OVERDUE_AFTER_S)
    _send(stalled, 2, comm=_comm(groups=[_group(4811)]))
    assert _series(stalled, "mfuscope_collective_group_entered_seq") == {}
    assert _series(stalled, "mfuscope_collective_hang_suspect_seconds") == {}
    clock.advance(1.0)
    entered = _series(stalled, "mfuscope_collective_group_entered_seq")
    assert entered == {("job-a", "2", "h2", "n1", "3", "dp", "inter_node"): 4811.0}
    # The waiting sidecar's blocked ranks export no progress of their own.
    assert _series(waiting, "mfuscope_collective_group_entered_seq") == {}
    # Rank 2 steps again: its progress series is gone.
    _send(stalled, 2, reports=[report_dict(2)], comm=_comm(groups=[_group(4812)]))
    assert _series(stalled, "mfuscope_collective_group_entered_seq") == {}


def test_a_group_across_sidecars_exports_each_ranks_held_sample() -> None:
    # Group "3" has 4 ranks; ranks 0 and 1 report here, 2 and 3 elsewhere: it never completes
    # here, so each rank's sample is held, one per period (60 s by default), and exported.
    collector = Aggregator(StateConfig(arrival_sample_s=60.0), clock=FakeClock())
    base = 1_763_700_000_000_000_000  # a whole minute since the epoch
    for rank, ms in ((0, 0), (1, 30)):
        arrivals = [
            {"group": "3", "seq": 100, "enqueued_unix_ns": base + ms * 1_000_000},
            # The next step's, same period: the first one of the period stays held.
            {"group": "3", "seq": 104, "enqueued_unix_ns": base + (500 + ms) * 1_000_000},
        ]
        _send(collector, rank, comm=_comm(groups=[_group(104)], arrivals=arrivals))
    assert _series(collector, "mfuscope_collective_arrival_skew_seconds") == {}
    labels = {r: ("job-a", str(r), f"h{r}", "n0", "3", "dp", "inter_node") for r in (0, 1)}
    assert _series(collector, "mfuscope_collective_arrival_seq") == {
        labels[0]: 100.0,
        labels[1]: 100.0,
    }
    enqueued = _series(collector, "mfuscope_collective_arrival_enqueued_seconds")
    assert enqueued[labels[1]] - enqueued[labels[0]] == pytest.approx(0.030, abs=1e-6)
    sizes = _series(collector, "mfuscope_collective_group_size")
    assert sizes == {("job-a", "3", "dp", "inter_node"): 4.0}
    # A sample of the next period replaces the held one.
    later = [{"group": "3", "seq": 480, "enqueued_unix_ns": base + 60_001_000_000}]
    _send(collector, 0, comm=_comm(groups=[_group(480)], arrivals=later))
    assert _series(collector, "mfuscope_collective_arrival_seq")[labels[0]] == 480.0


def test_a_group_whole_on_one_collector_exports_no_held_samples() -> None:
    collector = Aggregator(StateConfig(), clock=FakeClock())
    for rank in range(4):
        arrivals = [{"group": "3", "seq": 100, "enqueued_unix_ns": 1_763_700_000_000_000_000}]
        _send(collector, rank, comm=_comm(groups=[_group(100)], arrivals=arrivals))
    assert _series(collector, "mfuscope_collective_arrival_seq") == {}
    assert _series(collector, "mfuscope_collective_group_size") == {}
    assert _series(collector, "mfuscope_collective_arrival_skew_seconds") != {}


def test_a_rank_stuck_before_its_first_step_is_named_in_every_layout() -> None:
    """Ranks 0, 1 and 3 wait in their first step's all_reduce (#1 of group "3"); rank 2 never
    reached it (stuck in its start-up: data, NCCL's set-up): its agent reports the group with
    nothing entered, and no step at all."""
    waiting_group = _group(1, (1, 12.0))
    waiting_group["completed_seq"] = 0
    # One collector: its own join names rank 2.
    clock = FakeClock()
    one = Aggregator(StateConfig(), clock=clock)
    for rank in (0, 1, 3):
        _send(one, rank, comm=_comm(groups=[waiting_group]))
    _send(one, 2, comm=_comm(groups=[_group(0)]))
    key = ("job-a", "2", "h2", "n1", "all_reduce", "1", "dp", "inter_node", "not_joined")
    assert set(_series(one, "mfuscope_collective_hang_suspect_seconds")) == {key}
    # Per-node sidecars: rank 2's sidecar sees nobody blocked; from OVERDUE_AFTER_S after rank
    # 2's first report (it never reported a step) it exports rank 2's progress for the rules'
    # join (a rank that never stepped was never overdue before).
    clock = FakeClock()
    waiting, stalled = (
        Aggregator(StateConfig(), clock=clock),
        Aggregator(StateConfig(), clock=clock),
    )
    for rank in (0, 1, 3):
        _send(waiting, rank, comm=_comm(groups=[waiting_group]))
    _send(stalled, 2, comm=_comm(groups=[_group(0)]))
    assert _series(stalled, "mfuscope_collective_group_entered_seq") == {}
    clock.advance(OVERDUE_AFTER_S + 1.0)
    _send(stalled, 2, comm=_comm(groups=[_group(0)]))
    entered = _series(stalled, "mfuscope_collective_group_entered_seq")
    assert entered == {("job-a", "2", "h2", "n1", "3", "dp", "inter_node"): 0.0}
    waited = _series(waiting, "mfuscope_collective_group_waiting_seq")
    assert waited == {("job-a", "3", "1", "all_reduce", "dp", "inter_node"): 1.0}
