"""gloo collectives on a job with several process groups: the worker-thread -> group map names
each annotation's group (axis, size, ranks, tier), given as an option or read from the trace."""

from __future__ import annotations

import json
from typing import Any

import pytest
from mfuscope.core.trace import AnalysisOptions, analyze_trace, read_trace
from mfuscope.core.trace.worker_groups import (
    TRACE_KEY,
    trace_fields,
    worker_groups_from_trace,
)

from tests.support.trace_builder import Group, TraceBuilder

# The groups rank 0 of a 2x2 ("dp", "tp") DeviceMesh on gloo belongs to, as torch 2.13 lists
# them in distributedInfo.pg_config (group "2", the other dp group, has no rank 0).
MESH_GROUPS = (
    Group("0", "default_pg", (0, 1, 2, 3)),
    Group("1", "mesh_dp", (0, 2)),
    Group("3", "mesh_tp", (0, 1)),
)
# Two worker threads per group (ProcessGroupGloo's default), ids in group creation order.
WORKERS = {101: "0", 102: "0", 111: "1", 112: "1", 121: "3", 122: "3"}


def mesh_trace() -> dict[str, Any]:
    b = TraceBuilder(gpu=False, groups=MESH_GROUPS, world_size=4)
    for tid in WORKERS:
        b.thread_name(tid, "pt_gloo_runloop")
    b.profiler_step(1, 0.0, 100.0)
    b.gloo("all_reduce", 10.0, 10.0, nelems=1000, tid=121)  # tp
    b.gloo("all_reduce", 40.0, 20.0, nelems=2000, tid=112)  # dp
    b.gloo("all_gather", 70.0, 10.0, nelems=500, tid=122)  # tp: S = 2 x the input
    return b.build()


def by_axis(options: AnalysisOptions, trace: dict[str, Any]) -> list[tuple[Any, ...]]:
    step = analyze_trace(trace, options).steps[0]
    return [(c.op, c.axis, c.tier, c.group_size, c.bytes) for c in step.collectives]


def test_without_a_map_several_groups_stay_unknown() -> None:
    rows = by_axis(AnalysisOptions(), mesh_trace())
    assert {(axis, n) for _, axis, _, n, _ in rows} == {("unknown", None)}


def test_the_map_gives_every_annotation_its_group() -> None:
    rows = by_axis(AnalysisOptions(gloo_worker_groups=WORKERS), mesh_trace())
    assert rows == [
        ("all_reduce", "tp", "intra_node", 2, 4000),
        ("all_reduce", "dp", "intra_node", 2, 8000),
        ("all_gather", "tp", "intra_node", 2, 2 * 500 * 4),
    ]
    step = analyze_trace(mesh_trace(), AnalysisOptions(gloo_worker_groups=WORKERS)).steps[0]
    # Bus bandwidth with n = 2: all_reduce factor 2(n-1)/n = 1, all_gather (n-1)/n = 1/2.
    tp_ar, dp_ar, tp_ag = step.collectives
    assert tp_ar.busbw_bytes_per_s == pytest.approx(4000 / 10e-6 * 1.0)
    assert dp_ar.busbw_bytes_per_s == pytest.approx(8000 / 20e-6 * 1.0)
    assert tp_ag.busbw_bytes_per_s == pytest.approx(4000 / 10e-6 * 0.5)
    assert {e.axis for e in step.exposed_comm} == {"tp", "dp"}


def test_ranks_of_the_mapped_group_decide_its_tier() -> None:
    hosts = {0: "a", 1: "a", 2: "b", 3: "b"}  # tp inside a host, dp across hosts
    rows = by_axis(AnalysisOptions(gloo_worker_groups=WORKERS, host_of_rank=hosts), mesh_trace())
    assert [(axis, tier) for _, axis, tier, _, _ in rows] == [
        ("tp", "intra_node"),
        ("dp", "inter_node"),
        ("tp", "intra_node"),
    ]


def test_threads_the_map_does_not_name_keep_todays_rule() -> None:
    partial = {121: "3", 122: "3", 112: "no-such-group"}
    rows = by_axis(AnalysisOptions(gloo_worker_groups=partial), mesh_trace())
    assert [(axis, n) for _, axis, _, n, _ in rows] == [("tp", 2), ("unknown", None), ("tp", 2)]


def test_megatron_group_names_become_tp_and_dp() -> None:
    groups = (
        Group("0", "default_pg", (0, 1, 2, 3)),
        Group("1", "DATA_PARALLEL_GROUP", (0, 2)),
        Group("3", "TENSOR_MODEL_PARALLEL_GROUP", (0, 1)),
    )
    b = TraceBuilder(gpu=False, groups=groups, world_size=4)
    b.profiler_step(1, 0.0, 100.0)
    b.gloo("all_reduce", 10.0, 10.0, nelems=10, tid=121)
    b.gloo("all_reduce", 40.0, 10.0, nelems=10, tid=111)
    rows = by_axis(AnalysisOptions(gloo_worker_groups=WORKERS), b.build())
    assert [(axis, n) for _, axis, _, n, _ in rows] == [("tp", 2), ("dp", 2)]


def test_user_mapping_wins_over_the_table() -> None:
    options = AnalysisOptions(gloo_worker_groups=WORKERS, axis_overrides={"mesh_dp": "fsdp"})
    rows = by_axis(options, mesh_trace())
    assert [axis for _, axis, _, _, _ in rows] == ["tp", "fsdp", "tp"]


def test_a_kept_trace_carries_the_map_for_offline_analysis(tmp_path: Any) -> None:
    trace = {TRACE_KEY: trace_fields(WORKERS), **mesh_trace()}
    path = tmp_path / "kept.json"
    path.write_text(json.dumps(trace))
    expected = by_axis(AnalysisOptions(gloo_worker_groups=WORKERS), mesh_trace())
    for read in (trace, read_trace(path)):  # the decoded dict and the fast reader alike
        step = analyze_trace(read, AnalysisOptions()).steps[0]
        got = [(c.op, c.axis, c.tier, c.group_size, c.bytes) for c in step.collectives]
        assert got == expected


@pytest.mark.parametrize(
    "extra",
    [None, 3, {}, {"gloo_worker_groups": []}, {"gloo_worker_groups": {"x1": "0"}}],
)
def test_a_malformed_trace_key_is_no_map(extra: object) -> None:
    assert worker_groups_from_trace(extra) is None


def test_options_reject_a_map_that_is_not_int_to_str() -> None:
    with pytest.raises(ValueError, match="gloo_worker_groups"):
        AnalysisOptions(gloo_worker_groups={"101": "0"})  # type: ignore[dict-item]


def test_megatron_pipeline_group_gives_pipeline_bubble() -> None:
    """The pipeline-bubble rule keys on axis ``pp``: a Megatron-named group reaches it. (A GPU
    trace: NCCL kernels name their group's description, Megatron-core's ``group_desc``.)"""
    pp = Group("5", "PIPELINE_MODEL_PARALLEL_GROUP", (0, 4))
    b = TraceBuilder(world_size=8, groups=(Group("0", "default_pg", tuple(range(8))), pp))
    b.profiler_step(1, 0.0, 200.0)
    b.kernel(100.0, 10.0, launch_at=1.0)
    b.comm_kernel(100.0, 40.0, op="recv", group=pp, nelems=2000, launch_at=2.0)
    (step,) = analyze_trace(b.build(), AnalysisOptions(links=None)).steps
    assert [(c.op, c.axis) for c in step.collectives] == [("recv", "pp")]
    # No link model: every exposed microsecond of the pp recv is pipeline bubble.
    assert step.bubble_pipeline_s == pytest.approx(30e-6)
