"""CPU-only (gloo) traces: host operators are compute, gloo work items are communication."""

from __future__ import annotations

import pytest
from mfuscope.core.trace import AnalysisOptions, analyze_trace

from tests.support.trace_builder import AUTOGRAD_TID, GLOO_TIDS, MAIN_TID, Group, TraceBuilder

US = 1e-6


def approx(value: float) -> object:
    return pytest.approx(value, rel=1e-9, abs=1e-12)


def cpu_builder(groups: tuple[Group, ...] = (Group("0", "default_pg", (0, 1)),)) -> TraceBuilder:
    world = 1 + max(r for g in groups for r in g.ranks)
    b = TraceBuilder(gpu=False, groups=groups, world_size=world)
    b.thread_name(GLOO_TIDS[0], "pt_gloo_runloop")
    return b


def test_operators_compute_enqueue_holes_and_gloo_comm() -> None:
    b = cpu_builder()
    b.profiler_step(3, 0.0, 100.0)
    b.profiler_step(4, 100.0, 150.0)
    b.cpu_op("aten::linear", 5.0, 25.0)
    b.cpu_op("aten::addmm", 10.0, 20.0)  # nested: changes nothing
    b.cpu_op("autograd::engine::evaluate_function: AccumulateGrad", 30.0, 50.0)
    b.cpu_op("c10d::allreduce_", 40.0, 50.0)  # enqueue: cut out of compute, in flight from 40
    b.gloo("all_reduce", 45.0, 30.0, nelems=1000)  # [45, 75) on the gloo worker
    b.cpu_op("aten::copy_", 60.0, 70.0, tid=GLOO_TIDS[0])  # inside gloo work: not compute
    b.cpu_op("c10d::send", 80.0, 95.0)
    b.gloo("send", 90.0, 5.0, nelems=10, tid=MAIN_TID)  # blocking on the calling thread
    b.cpu_op("aten::mul", 110.0, 120.0, tid=AUTOGRAD_TID)
    result = analyze_trace(b.build())
    assert (result.device, result.rank, result.world_size) == ("cpu", 0, 2)
    first, second = result.steps
    assert (first.step, first.start_s, first.wall_s) == (3, approx(1.7e9), approx(100.0 * US))
    assert first.compute_s == approx(30.0 * US)  # [5,25) + [30,40)
    assert first.exposed_comm_s == approx(40.0 * US)  # [40,75) + [90,95)
    assert first.overlapped_comm_s == 0.0
    assert first.bubble_idle_s == approx(30.0 * US)
    ops = [(c.op, c.axis, c.tier, c.group_size, c.bytes) for c in first.collectives]
    assert ops == [
        ("all_reduce", "world", "intra_node", 2, 4000),
        ("send", "world", "intra_node", 2, 40),
    ]
    assert (second.step, second.wall_s, second.compute_s) == (4, approx(50 * US), approx(10 * US))


def test_a_blocked_wait_before_the_worker_starts_is_exposed_comm() -> None:
    # As recorded on a loaded 2-core machine: gloo's worker picked the all_reduce up ~1.9 ms
    # after c10d::allreduce_ enqueued it, while the caller waited with nothing on the trace.
    b = cpu_builder()
    b.profiler_step(1, 0.0, 5000.0)
    b.cpu_op("aten::mm", 0.0, 1000.0)
    b.cpu_op("c10d::allreduce_", 1000.0, 1050.0)
    b.gloo("all_reduce", 2950.0, 1000.0, nelems=1000)
    (step,) = analyze_trace(b.build()).steps
    assert step.compute_s == approx(1000 * US)
    assert step.exposed_comm_s == approx(2950 * US)  # [1000, 3950): enqueue to completion
    assert step.bubble_idle_s == approx(1050 * US)
    (record,) = step.collectives
    assert record.seconds == approx(1000 * US)  # bandwidth: the worker's own span


def test_async_work_overlaps_what_the_caller_runs_until_it_waits() -> None:
    # Two async all_reduces (as DDP buckets), paired with their work items first in, first out:
    # compute on the caller hides the in-flight time, the wait after it is exposed.
    b = cpu_builder()
    b.profiler_step(1, 0.0, 1000.0)
    b.cpu_op("c10d::allreduce_", 100.0, 110.0)
    b.cpu_op("aten::mm", 110.0, 300.0)
    b.cpu_op("c10d::allreduce_", 300.0, 310.0)
    b.cpu_op("aten::mm", 310.0, 600.0)
    b.gloo("all_reduce", 400.0, 100.0, nelems=10)  # the first one, picked up late
    b.gloo("all_reduce", 500.0, 200.0, nelems=20, tid=GLOO_TIDS[1])
    (step,) = analyze_trace(b.build()).steps
    assert step.compute_s == approx(480 * US)  # [110,300) + [310,600)
    # in flight: [100, 500) and [300, 700); exposed where nothing computes: [100,110),
    # [300,310) (the enqueues) and [600,700) (the caller waits for the second)
    assert step.exposed_comm_s == approx(120 * US)
    first, second = step.collectives
    assert (first.bytes, second.bytes) == (40, 80)
    # hidden: 380 of its 400 µs in flight, and 290 of 400
    assert (first.overlapped_ratio, second.overlapped_ratio) == (approx(0.95), approx(0.725))
    assert (first.seconds, second.seconds) == (approx(100 * US), approx(200 * US))


def test_gloo_all_gather_bytes_are_the_gathered_array() -> None:
    b = cpu_builder(groups=(Group("0", "default_pg", (0, 1, 2, 3)),))
    b.profiler_step(1, 0.0, 10.0)
    b.gloo("all_gather", 1.0, 5.0, nelems=1000, dtype="BFloat16")
    (record,) = analyze_trace(b.build()).steps[0].collectives
    assert (record.op, record.group_size, record.bytes) == ("all_gather", 4, 4 * 1000 * 2)
    assert record.busbw_bytes_per_s == approx(8000 / 5e-6 * 3 / 4)


def test_gloo_with_several_groups_keeps_axis_unknown() -> None:
    groups = (Group("0", "default_pg", (0, 1, 2, 3)), Group("1", "mesh_dp", (0, 2)))
    b = cpu_builder(groups=groups)
    b.profiler_step(1, 0.0, 10.0)
    b.gloo("all_reduce", 1.0, 5.0, nelems=10)
    (record,) = analyze_trace(b.build()).steps[0].collectives
    # Group sizes differ: the size is unknown (null with the reason, never the world size),
    # so busbw is not computed.
    assert (record.axis, record.tier, record.group_size) == ("unknown", "intra_node", None)
    assert record.group_size_reason is not None and "several sizes" in record.group_size_reason
    assert record.busbw_bytes_per_s is None and record.bytes == 40


def test_cpu_tiers_use_gpus_per_node_or_hosts_when_told() -> None:
    b = cpu_builder(groups=(Group("0", "default_pg", (0, 1)),))
    b.profiler_step(1, 0.0, 10.0)
    b.gloo("broadcast", 1.0, 5.0)
    assert analyze_trace(b.build()).steps[0].collectives[0].tier == "intra_node"
    told = AnalysisOptions(gpus_per_node=1)
    assert analyze_trace(b.build(), told).steps[0].collectives[0].tier == "inter_node"
    hosts = AnalysisOptions(host_of_rank={0: "a", 1: "b"})
    assert analyze_trace(b.build(), hosts).steps[0].collectives[0].tier == "inter_node"


def test_cpu_recompute_inside_the_annotation() -> None:
    b = cpu_builder()
    b.profiler_step(1, 0.0, 100.0)
    b.annotation("mfuscope::recompute", 20.0, 40.0, AUTOGRAD_TID)
    b.cpu_op("aten::addmm", 10.0, 50.0, tid=AUTOGRAD_TID)
    b.cpu_op("aten::relu", 30.0, 35.0, tid=MAIN_TID)  # compute wins over recompute
    s = analyze_trace(b.build()).steps[0]
    assert s.compute_s == approx(25.0 * US)
    assert s.recompute_s == approx(15.0 * US)
