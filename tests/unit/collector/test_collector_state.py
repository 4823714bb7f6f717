"""Aggregation semantics: exact counters, idempotency, expiry, latest-window gauges, stragglers."""

from __future__ import annotations

import gc
import json
import tracemalloc
from pathlib import Path
from typing import Any

import mfuscope.collector as collector_package
import mfuscope.core as core_package
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from mfuscope.collector import Aggregator, StateConfig

from tests.support.collector_fakes import FakeClock, batch_dict, report_dict

# The collector's code and the core code it calls.
PACKAGES = [str(Path(package.__file__).parent) for package in (collector_package, core_package)]
Series = dict[tuple[str, tuple[str, ...]], float]


def _ingest(collector: Aggregator, batch: dict[str, Any]) -> tuple[int, int]:
    result = collector.ingest(json.dumps(batch).encode())
    return result.accepted, result.duplicates


def _series(collector: Aggregator) -> Series:
    out: Series = {}
    for family in collector.families():
        for s in family.samples:
            out[(family.name, s.labels)] = s.value
        for h in family.histogram_samples:
            out[(family.name + "_count", h.labels)] = float(h.count)
            out[(family.name + "_sum", h.labels)] = h.sum
    return out


def _new(**config: Any) -> tuple[Aggregator, FakeClock]:
    clock = FakeClock()
    return Aggregator(StateConfig(**config), clock=clock), clock


def test_counters_sum_exactly_over_ranks() -> None:
    collector, _ = _new()
    _ingest(collector, batch_dict(rank=0, steps=[1, 2]))
    _ingest(collector, batch_dict(rank=1, reports=[report_dict(1, wall_s=2.0)]))
    s = _series(collector)
    job = ("job-a",)
    assert s[("mfuscope_steps_total", job)] == 3
    assert s[("mfuscope_step_seconds_total", job)] == 4.0
    assert s[("mfuscope_model_flops_total", job)] == 3 * 4e11
    assert s[("mfuscope_hardware_flops_total", job)] == 3 * 5e11
    # Each rank's peak (1e12 FLOP/s) x its steps' wall time: 1 s + 1 s + 2 s.
    assert s[("mfuscope_peak_flop_seconds_total", job)] == 4e12
    assert s[("mfuscope_step_component_seconds_total", ("job-a", "compute", "", ""))] == 3.0
    exposed = ("job-a", "exposed_comm", "dp", "intra_node")
    assert s[("mfuscope_step_component_seconds_total", exposed)] == 1.0
    assert s[("mfuscope_step_duration_seconds_count", job)] == 3
    assert s[("mfuscope_step_duration_seconds_sum", job)] == 4.0
    assert s[("mfuscope_peak_flops", job)] == 2e12
    assert s[("mfuscope_ranks", job)] == 2
    assert s[("mfuscope_world_size", job)] == 2


def test_pipeline_bubble_is_exported_on_the_pp_axis() -> None:
    # Only waits of send/recv on the pp axis become pipeline bubble, so the wire carries no axis
    # for it and the collector names pp; idle bubble stays without an axis.
    collector, _ = _new()
    report = report_dict(1, compute_fraction=0.5, exposed=None)
    report["components"] = [
        {"component": "compute", "seconds": 0.5},
        {"component": "bubble_pipeline", "seconds": 0.3},
        {"component": "bubble_idle", "seconds": 0.2},
    ]
    _ingest(collector, batch_dict(reports=[report]))
    s = _series(collector)
    name = "mfuscope_step_component_seconds_total"
    assert s[(name, ("job-a", "bubble_pipeline", "pp", ""))] == 0.3
    assert s[(name, ("job-a", "bubble_idle", "", ""))] == pytest.approx(0.2)
    assert (name, ("job-a", "bubble_pipeline", "", "")) not in s
    # the latest breakdown's ratio names the same axis as the counter
    ratio = "mfuscope_step_component_ratio"
    assert s[(ratio, ("job-a", "bubble_pipeline", "pp", ""))] == pytest.approx(0.3)
    assert (ratio, ("job-a", "bubble_pipeline", "", "")) not in s


def test_resent_steps_are_acknowledged_not_counted() -> None:
    collector, _ = _new()
    assert _ingest(collector, batch_dict(steps=[1, 2])) == (2, 0)
    before = _series(collector)
    assert _ingest(collector, batch_dict(steps=[1, 2])) == (0, 2)
    assert _ingest(collector, batch_dict(steps=[2, 3])) == (1, 1)
    after = _series(collector)
    assert after[("mfuscope_steps_total", ("job-a",))] == 3
    assert after[("mfuscope_reports_duplicate_total", ("job-a",))] == 3
    assert before[("mfuscope_step_seconds_total", ("job-a",))] == 2.0
    assert after[("mfuscope_step_seconds_total", ("job-a",))] == 3.0


def test_same_step_of_another_rank_or_job_is_not_a_duplicate() -> None:
    collector, _ = _new()
    assert _ingest(collector, batch_dict(rank=0, steps=[1])) == (1, 0)
    assert _ingest(collector, batch_dict(rank=1, steps=[1])) == (1, 0)
    assert _ingest(collector, batch_dict(job="job-b", rank=0, steps=[1])) == (1, 0)


def test_silent_ranks_expire_and_their_job_series_disappear() -> None:
    collector, clock = _new(expire_after_s=60)
    _ingest(collector, batch_dict(rank=0, steps=[1]))
    clock.advance(30)
    _ingest(collector, batch_dict(rank=1, steps=[1]))
    clock.advance(30)  # rank 0 silent for exactly 60 s: still live
    assert _series(collector)[("mfuscope_ranks", ("job-a",))] == 2
    clock.advance(0.5)
    s = _series(collector)
    assert s[("mfuscope_ranks", ("job-a",))] == 1
    assert s[("mfuscope_steps_total", ("job-a",))] == 2  # job counters stay while the job lives
    assert s[("mfuscope_last_report_age_seconds", ("job-a",))] == 30.5
    clock.advance(30)
    assert not [k for k in _series(collector) if "job-a" in k[1]]
    assert collector.snapshot().jobs == ()


def test_expired_rank_series_disappear_with_per_rank_labels() -> None:
    collector, clock = _new(expire_after_s=10, per_rank_labels=True)
    _ingest(collector, batch_dict(rank=0, steps=[1]))
    clock.advance(8)
    _ingest(collector, batch_dict(rank=1, steps=[1, 2]))
    clock.advance(5)
    s = _series(collector)
    assert ("mfuscope_steps_total", ("job-a", "0")) not in s
    assert s[("mfuscope_steps_total", ("job-a", "1"))] == 2
    assert s[("mfuscope_peak_flops", ("job-a", "1"))] == 1e12


def test_a_returning_rank_after_expiry_counts_again() -> None:
    collector, clock = _new(expire_after_s=10)
    _ingest(collector, batch_dict(steps=[1]))
    clock.advance(11)
    assert _ingest(collector, batch_dict(steps=[1])) == (1, 0)


def _health(dropped: int, failures: int = 0) -> dict[str, int]:
    return {"reports_dropped_total": dropped, "send_failures_total": failures}


def test_health_sums_the_ranks_latest_counts_and_keeps_expired_ranks() -> None:
    collector, clock = _new(expire_after_s=10)
    _ingest(collector, batch_dict(rank=0, steps=[1], health=_health(3, 1)))
    _ingest(collector, batch_dict(rank=0, steps=[2], health=_health(5, 1)))
    clock.advance(5)
    _ingest(collector, batch_dict(rank=1, steps=[1], health=_health(2)))
    s = _series(collector)
    assert s[("mfuscope_reports_dropped_total", ("job-a",))] == 7
    assert s[("mfuscope_agent_send_failures_total", ("job-a",))] == 1
    clock.advance(6)  # rank 0 expires; its counts stay in the job's counters
    s = _series(collector)
    assert s[("mfuscope_ranks", ("job-a",))] == 1
    assert s[("mfuscope_reports_dropped_total", ("job-a",))] == 7
    assert s[("mfuscope_agent_send_failures_total", ("job-a",))] == 1
    # Rank 0 returns with the same agent process: it continues, nothing is counted twice.
    _ingest(collector, batch_dict(rank=0, steps=[3], health=_health(6, 1)))
    assert _series(collector)[("mfuscope_reports_dropped_total", ("job-a",))] == 8
    clock.advance(11)  # the whole job expires: its series disappear, and restart from zero
    assert ("mfuscope_reports_dropped_total", ("job-a",)) not in _series(collector)
    _ingest(collector, batch_dict(rank=1, steps=[9], health=_health(4)))
    assert _series(collector)[("mfuscope_reports_dropped_total", ("job-a",))] == 4


@pytest.mark.parametrize("per_rank_labels", [False, True])
def test_a_restarted_agent_adds_its_new_counts_on_top(per_rank_labels: bool) -> None:
    collector, _ = _new(per_rank_labels=per_rank_labels)
    who = ("job-a", "0") if per_rank_labels else ("job-a",)
    _ingest(collector, batch_dict(rank=0, steps=[1], health=_health(5, 2)))
    # A new agent process: every counter starts again from zero; a decrease in any one of them
    # marks the restart, so the new counts go on top of all the old ones.
    _ingest(collector, batch_dict(rank=0, steps=[2], health=_health(1, 2)))
    s = _series(collector)
    assert s[("mfuscope_reports_dropped_total", who)] == 6
    assert s[("mfuscope_agent_send_failures_total", who)] == 4
    _ingest(collector, batch_dict(rank=0, steps=[3], health=_health(3, 2)))
    s = _series(collector)
    assert s[("mfuscope_reports_dropped_total", who)] == 8
    assert s[("mfuscope_agent_send_failures_total", who)] == 4
    summary_health = collector.snapshot().jobs[0].health
    assert (summary_health.reports_dropped_total, summary_health.send_failures_total) == (8, 4)


def test_unknown_peaks_are_counted_not_guessed() -> None:
    collector, _ = _new()
    _ingest(collector, batch_dict(rank=0, steps=[1]))
    _ingest(collector, batch_dict(rank=1, steps=[1], peak_flops=None))
    s = _series(collector)
    assert s[("mfuscope_peak_flops", ("job-a",))] == 1e12
    assert s[("mfuscope_peak_flops_unknown_ranks", ("job-a",))] == 1
    # MFU over the ranks whose peak is known: 4e11 FLOP/s of 1e12.
    assert s[("mfuscope_mfu_ratio", ("job-a",))] == pytest.approx(0.4)
    assert s[("mfuscope_hfu_ratio", ("job-a",))] == pytest.approx(0.5)


def test_peak_flop_seconds_count_only_steps_run_on_a_known_peak() -> None:
    """model FLOPs / peak FLOP-seconds is MFU over whatever the counters cover: idle time between
    batches adds nothing, a rank whose peak changes counts each step at the peak it ran on."""
    collector, clock = _new()
    _ingest(collector, batch_dict(rank=0, reports=[report_dict(1, wall_s=2.0)]))
    clock.advance(120)  # a pause: no steps, nothing counted
    _ingest(collector, batch_dict(rank=0, peak_flops=2e12, reports=[report_dict(2, wall_s=1.0)]))
    _ingest(collector, batch_dict(rank=1, peak_flops=None, reports=[report_dict(1)]))
    s = _series(collector)
    assert s[("mfuscope_peak_flop_seconds_total", ("job-a",))] == 1e12 * 2.0 + 2e12 * 1.0


def test_no_known_peak_means_no_mfu_series() -> None:
    collector, _ = _new()
    _ingest(collector, batch_dict(steps=[1], peak_flops=None))
    assert not [k for k in _series(collector) if k[0] == "mfuscope_mfu_ratio"]


def test_latest_window_covers_only_the_last_steps() -> None:
    collector, _ = _new(window_steps=2)
    reports = [report_dict(1, wall_s=4.0), report_dict(2, wall_s=1.0), report_dict(3, wall_s=1.0)]
    _ingest(collector, batch_dict(reports=reports))
    s = _series(collector)
    assert s[("mfuscope_mfu_ratio", ("job-a",))] == pytest.approx(0.4)  # steps 2 and 3 only
    assert s[("mfuscope_steps_total", ("job-a",))] == 3


def test_collectives_follow_nccl_tests_bus_factors() -> None:
    collectives = [
        {"op": "all_reduce", "axis": "dp", "tier": "inter_node", "group_size": 4, "bytes": 1000,
         "count": 2, "seconds": 0.5, "overlapped_s": 0.25},
        {"op": "all_gather", "axis": "tp", "tier": "intra_node", "group_size": 8, "bytes": 800,
         "count": 1, "seconds": 0.1, "overlapped_s": 0.0},
        {"op": "all_gather", "axis": "tp", "tier": "intra_node", "group_size": 8, "bytes": None,
         "count": 3, "seconds": 0.3, "overlapped_s": 0.0},
    ]  # fmt: skip
    topology = {
        "groups": [
            {"axis": "dp", "tier": "inter_node", "size": 4, "spans_hosts": True,
             "link_peak_bytes_per_s": 6000.0},
            {"axis": "tp", "tier": "intra_node", "size": 8, "spans_hosts": True},
        ]
    }  # fmt: skip
    collector, _ = _new()
    _ingest(
        collector,
        batch_dict(reports=[report_dict(1, collectives=collectives)], topology=topology),
    )
    s = _series(collector)
    ar = ("job-a", "all_reduce", "dp", "inter_node")
    ag = ("job-a", "all_gather", "tp", "intra_node")
    assert s[("mfuscope_collective_calls_total", ar)] == 2
    assert s[("mfuscope_collective_bytes_total", ar)] == 2000
    assert s[("mfuscope_collective_bus_bytes_total", ar)] == 2000 * 2 * 3 / 4
    assert s[("mfuscope_collective_seconds_total", ar)] == 0.5
    assert s[("mfuscope_collective_overlapped_seconds_total", ar)] == 0.25
    # The unsized all_gather adds calls and seconds, but no bytes.
    assert s[("mfuscope_collective_calls_total", ag)] == 4
    assert s[("mfuscope_collective_bytes_total", ag)] == 800
    assert s[("mfuscope_collective_bus_bytes_total", ag)] == 800 * 7 / 8
    assert s[("mfuscope_collective_seconds_total", ag)] == pytest.approx(0.4)
    # Latest-window busbw uses only the sized calls' time: 3000 B / 0.5 s and 700 B / 0.1 s.
    dp, tp = ("job-a", "dp", "inter_node"), ("job-a", "tp", "intra_node")
    assert s[("mfuscope_collective_bus_bandwidth_bytes_per_second", dp)] == 6000.0
    assert s[("mfuscope_collective_bus_bandwidth_bytes_per_second", tp)] == pytest.approx(7000.0)
    assert s[("mfuscope_collective_bus_bandwidth_ratio", dp)] == 1.0
    assert ("mfuscope_collective_bus_bandwidth_ratio", tp) not in s  # no spec peak known
    assert s[("mfuscope_tier_peak_bandwidth_bytes_per_second", dp)] == 6000.0
    assert s[("mfuscope_tp_spans_hosts", ("job-a",))] == 1


def _job_with_breakdowns(fractions: list[float], *, pods: bool = False) -> Aggregator:
    """Ranks 2r and 2r+1 on node-r; with `pods` each rank in its own pod (host name pod-<rank>)
    and the agents send the node, else the host is the node and no node is sent."""
    collector, _ = _new()
    for rank, compute in enumerate(fractions):
        placement = {"host": f"pod-{rank}", "node": f"node-{rank // 2}"}
        _ingest(
            collector,
            batch_dict(
                rank=rank,
                world_size=len(fractions),
                reports=[report_dict(s, compute_fraction=compute) for s in (1, 2, 3)],
                **(placement if pods else {"host": f"node-{rank // 2}"}),
            ),
        )
    return collector


def test_straggler_is_the_rank_that_waits_least() -> None:
    # Equal wall time (a synchronous job); rank 2 computes longest and waits least.
    collector = _job_with_breakdowns([0.5, 0.5, 0.9, 0.5])
    job = collector.snapshot().jobs[0]
    assert job.straggler_basis == "self"
    assert job.stragglers[0].rank == 2
    assert job.stragglers[0].ratio == pytest.approx(0.9 / 0.5)
    s = _series(collector)
    # The series names the host and node the rank reports from: where an operator goes to
    # look. An agent that sends no node (an older one) names its host.
    key = ("job-a", "2", "node-1", "node-1")
    assert s[("mfuscope_straggler_ratio", key)] == pytest.approx(1.8)
    assert len([k for k in s if k[0] == "mfuscope_straggler_ratio"]) == 3
    # Two pods per node: host = the pod, node = the node identity the agents sent.
    pods = _series(_job_with_breakdowns([0.5, 0.5, 0.9, 0.5], pods=True))
    assert pods[("mfuscope_straggler_ratio", ("job-a", "2", "pod-2", "node-1"))] == pytest.approx(
        1.8
    )


def test_without_breakdowns_stragglers_use_wall_time() -> None:
    collector, _ = _new()
    for rank, wall in enumerate([1.0, 1.0, 1.3]):
        reports = [{**report_dict(1, wall_s=wall), "components": []}]
        _ingest(collector, batch_dict(rank=rank, world_size=3, reports=reports))
    job = collector.snapshot().jobs[0]
    assert job.straggler_basis == "wall"
    assert [(s.rank, round(s.ratio, 9)) for s in job.stragglers] == [(2, 1.3), (0, 1.0), (1, 1.0)]


def test_component_fractions_weight_each_ranks_latest_breakdown_by_wall_time() -> None:
    collector, _ = _new()
    _ingest(collector, batch_dict(rank=0, reports=[report_dict(1, compute_fraction=0.5)]))
    _ingest(
        collector,
        batch_dict(rank=1, reports=[report_dict(1, wall_s=3.0, compute_fraction=1.0)]),
    )
    s = _series(collector)
    assert s[("mfuscope_step_component_ratio", ("job-a", "compute", "", ""))] == 3.5 / 4
    exposed = ("job-a", "exposed_comm", "dp", "intra_node")
    assert s[("mfuscope_step_component_ratio", exposed)] == 0.5 / 4


@settings(max_examples=40, deadline=None)
@given(data=st.data())
def test_counters_do_not_depend_on_arrival_order(data: st.DataObject) -> None:
    # Integer-valued seconds and FLOPs keep float sums exact, so equality is exact.
    batches = [
        batch_dict(
            rank=rank,
            world_size=3,
            reports=[
                report_dict(step, wall_s=float(1 + (rank + step) % 3), compute_fraction=0.5)
                for step in steps
            ],
        )
        for rank in range(3)
        for steps in ([1, 2], [3], [2, 4])  # the last batch re-sends step 2
    ]
    shuffled = data.draw(st.permutations(batches))
    first, _ = _new()
    second, _ = _new()
    for b in batches:
        _ingest(first, b)
    for b in shuffled:
        _ingest(second, b)
    counters = {
        k: v for k, v in _series(first).items() if k[0].endswith(("_total", "_count", "_sum"))
    }
    assert counters == {k: v for k, v in _series(second).items() if k in counters}


def test_memory_stops_growing_once_every_window_is_full() -> None:
    # Bounded by live ranks, not by reports: once the per-rank windows are full, more new steps
    # must not grow what the collector holds. Tolerance: one deque block per rank (a deque
    # rotates through 64-slot blocks, so its footprint steps by one block now and then); leaking
    # even one float per report would exceed it nearly three times over (16 ranks x 5 steps x 14
    # steady rounds x 24 B). Only allocations made in the collector's and core's code count:
    # threads other tests of this worker left running allocate too. The heap before the test is
    # frozen, so each round's gc.collect() scans only what the test made (a worker's whole heap,
    # with torch, takes ~0.5 s per collection).
    ranks, rounds = 16, 24
    collector, clock = _new(window_steps=5)
    bodies = [
        [
            json.dumps(batch_dict(rank=rank, world_size=ranks, steps=range(k * 5 + 1, k * 5 + 6)))
            for rank in range(ranks)
        ]
        for k in range(rounds)
    ]
    # Attributed to the innermost Python frame (a C call's allocations to its caller's frame).
    mine = [tracemalloc.Filter(True, f"{package}/*") for package in PACKAGES]
    gc.collect()
    gc.freeze()
    tracemalloc.start()
    try:
        sizes = []
        for round_bodies in bodies:
            for body in round_bodies:
                collector.ingest(body.encode())
            clock.advance(5)
            collector.families()
            gc.collect()
            held = tracemalloc.take_snapshot().filter_traces(mine)
            sizes.append(sum(trace.size for trace in held.traces))
    finally:
        tracemalloc.stop()
        gc.unfreeze()
    steady = sizes[10:]
    assert max(steady) - min(steady) < ranks * 600, sizes
    assert _series(collector)[("mfuscope_steps_total", ("job-a",))] == ranks * rounds * 5


def test_compute_class_seconds_sum_over_ranks_and_only_where_reported() -> None:
    collector, _ = _new()
    with_classes = report_dict(1)
    with_classes["compute_classes"] = [
        {"kernel_class": "gemm", "seconds": 0.5},
        {"kernel_class": "elementwise_norm_reduce", "seconds": 0.25},
    ]
    _ingest(collector, batch_dict(rank=0, reports=[with_classes, report_dict(2)]))
    _ingest(collector, batch_dict(rank=1, reports=[dict(with_classes)]))
    s = _series(collector)
    assert s[("mfuscope_compute_class_seconds_total", ("job-a", "gemm"))] == 1.0
    assert s[("mfuscope_compute_class_seconds_total", ("job-a", "elementwise_norm_reduce"))] == 0.5
    assert ("mfuscope_compute_class_seconds_total", ("job-a", "attention")) not in s


def test_collectives_of_unknown_group_size_count_without_bus_bytes() -> None:
    collectives = [
        {"op": "all_reduce", "axis": "unknown", "tier": "intra_node", "group_size": None,
         "bytes": 1000, "count": 2, "seconds": 0.5, "overlapped_s": 0.0},
        {"op": "all_reduce", "axis": "unknown", "tier": "intra_node", "bytes": 10,
         "count": 1, "seconds": 0.1, "overlapped_s": 0.0},  # absent reads as null (1.0 batches)
    ]  # fmt: skip
    collector, _ = _new()
    _ingest(collector, batch_dict(reports=[report_dict(1, collectives=collectives)]))
    s = _series(collector)
    key = ("job-a", "all_reduce", "unknown", "intra_node")
    assert s[("mfuscope_collective_calls_total", key)] == 3
    assert s[("mfuscope_collective_seconds_total", key)] == pytest.approx(0.6)
    assert s[("mfuscope_collective_bytes_total", key)] == 2010
    # The bus factor needs n: no bus bytes, no busbw time, no busbw.
    assert s[("mfuscope_collective_bus_bytes_total", key)] == 0
    assert s[("mfuscope_collective_sized_seconds_total", key)] == 0
    assert ("mfuscope_collective_bus_bandwidth_bytes_per_second", key[0::2]) not in s
