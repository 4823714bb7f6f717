"""Hand-computed scenarios for the GPU decomposition (times in µs, results in s)."""

from __future__ import annotations

import math

import pytest
from mfuscope.core.bandwidth import LinkModel
from mfuscope.core.trace import AnalysisOptions, StepDecomposition, TraceError, analyze_trace

from tests.support.trace_builder import AUTOGRAD_TID, MAIN_TID, Group, TraceBuilder

US = 1e-6
TP = Group("1", "mesh_tp", (0, 1))
DP = Group("2", "mesh_dp", (0, 8))
PP = Group("3", "mesh_pp", (0, 4))


def approx(value: float) -> object:
    return pytest.approx(value, rel=1e-9, abs=1e-12)


def one_step(b: TraceBuilder, options: AnalysisOptions | None = None) -> StepDecomposition:
    result = analyze_trace(b.build(), options or AnalysisOptions())
    assert len(result.steps) == 1
    return result.steps[0]


def builder(**kw: object) -> TraceBuilder:
    b = TraceBuilder(world_size=16, groups=(TP, DP, PP), **kw)  # type: ignore[arg-type]
    b.profiler_step(1, 0.0, 50.0)
    return b


def test_multi_stream_compute_is_the_union_and_gaps_are_idle_bubble() -> None:
    b = builder()
    b.kernel(100.0, 40.0, stream=7, launch_at=1.0)  # [100, 140)
    b.kernel(120.0, 40.0, stream=8, launch_at=2.0)  # [120, 160): overlaps on another stream
    b.kernel(180.0, 20.0, stream=7, launch_at=3.0)  # [180, 200) after a 20 µs host gap
    s = one_step(b)
    assert s.start_s == approx(100.0 * US + 1.7e9)
    assert s.wall_s == approx(100.0 * US)  # last step ends with its last kernel
    assert s.compute_s == approx(80.0 * US)
    assert s.bubble_idle_s == approx(20.0 * US)
    assert s.bubble_s == approx(20.0 * US) and s.bubble_pipeline_s == 0.0
    assert s.exposed_comm_s == s.recompute_s == s.other_s == s.overlapped_comm_s == 0.0


def test_comm_hidden_under_compute_is_overlapped_not_exposed() -> None:
    b = builder()
    b.kernel(100.0, 50.0, launch_at=1.0)  # [100, 150)
    b.comm_kernel(130.0, 40.0, op="all_reduce", group=DP, nelems=1000, launch_at=2.0)  # [130,170)
    s = one_step(b)
    assert s.wall_s == approx(70.0 * US)
    assert s.compute_s == approx(50.0 * US)
    assert s.exposed_comm_s == approx(20.0 * US)
    assert s.overlapped_comm_s == approx(20.0 * US)
    assert [(e.axis, e.tier) for e in s.exposed_comm] == [("dp", "inter_node")]
    (record,) = s.collectives
    assert (record.op, record.axis, record.tier, record.group_size) == (
        "all_reduce",
        "dp",
        "inter_node",
        2,
    )
    assert record.bytes == 4000
    assert record.seconds == approx(40.0 * US)
    assert record.overlapped_ratio == approx(0.5)
    assert record.algbw_bytes_per_s == approx(4000 / (40.0 * US))
    assert record.busbw_bytes_per_s == approx(4000 / (40.0 * US) * 2 * (2 - 1) / 2)


def test_concurrent_comm_kernels_share_exposed_time_equally() -> None:
    b = builder()
    b.comm_kernel(100.0, 30.0, op="all_reduce", group=DP, launch_at=1.0, stream=40)  # [100,130)
    b.comm_kernel(110.0, 30.0, op="all_gather", group=TP, launch_at=2.0, stream=41)  # [110,140)
    s = one_step(b)
    exposed = {e.axis: e.seconds for e in s.exposed_comm}
    # dp alone 10 µs, both 20 µs (10 each), tp alone 10 µs.
    assert exposed == {"dp": approx(20.0 * US), "tp": approx(20.0 * US)}
    assert s.exposed_comm_s == approx(40.0 * US) and s.wall_s == approx(40.0 * US)
    gather = next(c for c in s.collectives if c.op == "all_gather")
    assert gather.bytes == 2 * (1 << 20) * 4  # the gathered array, nccl-tests S


def test_recompute_yields_to_compute_and_comes_before_comm() -> None:
    b = builder()
    b.annotation("mfuscope::recompute", 10.0, 20.0, AUTOGRAD_TID)
    b.kernel(100.0, 30.0, launch_at=12.0, launch_tid=AUTOGRAD_TID, recompute=True)  # [100,130)
    b.kernel(120.0, 20.0, launch_at=5.0)  # compute [120, 140)
    b.comm_kernel(90.0, 60.0, launch_at=3.0, group=TP)  # [90, 150)
    b.kernel(200.0, 1.0, launch_at=30.0, launch_tid=AUTOGRAD_TID)  # outside the range: compute
    s = one_step(b)
    assert s.wall_s == approx(111.0 * US)  # [90, 201)
    assert s.compute_s == approx(21.0 * US)
    assert s.recompute_s == approx(20.0 * US)
    assert s.exposed_comm_s == approx(20.0 * US)  # [90,100) and [140,150)
    assert s.overlapped_comm_s == approx(40.0 * US)
    assert s.bubble_idle_s == approx(50.0 * US)


def test_memcpy_only_time_is_other_and_loses_to_comm() -> None:
    b = builder()
    b.memcpy(100.0, 30.0, launch_at=1.0)  # [100, 130)
    b.memset(125.0, 15.0, launch_at=2.0, stream=9)  # [125, 140)
    b.comm_kernel(120.0, 10.0, launch_at=3.0, group=TP)  # [120, 130)
    s = one_step(b)
    assert s.other_s == approx(30.0 * US)
    assert s.exposed_comm_s == approx(10.0 * US)
    assert s.wall_s == approx(40.0 * US)


@pytest.mark.parametrize(
    ("links", "comm_us", "pipeline_us"),
    [
        # 8000 B over 1 GB/s = 8 µs + alpha 2 µs = 10 µs ideal out of 30 µs exposed.
        ({"intra_node": LinkModel(alpha_s=2e-6, beta_bytes_per_s=1e9)}, 10.0, 20.0),
        # Ideal longer than the exposure: all of it is communication.
        ({"intra_node": LinkModel(alpha_s=1e-3, beta_bytes_per_s=1e9)}, 30.0, 0.0),
        # No model for the tier / no links at all: exposed pp p2p is pipeline bubble.
        ({"inter_node": LinkModel(alpha_s=2e-6, beta_bytes_per_s=1e9)}, 0.0, 30.0),
        (None, 0.0, 30.0),
    ],
)
def test_pipeline_p2p_beyond_ideal_transfer_is_pipeline_bubble(
    links: dict[str, LinkModel] | None, comm_us: float, pipeline_us: float
) -> None:
    b = builder()
    b.kernel(100.0, 10.0, launch_at=1.0)  # [100, 110)
    b.comm_kernel(100.0, 40.0, op="recv", group=PP, nelems=2000, launch_at=2.0)  # [100, 140)
    s = one_step(b, AnalysisOptions(links=links))
    assert s.exposed_comm_s == approx(comm_us * US)
    assert s.bubble_pipeline_s == approx(pipeline_us * US)
    assert s.bubble_s == approx(pipeline_us * US)
    assert s.overlapped_comm_s == approx(10.0 * US)
    assert [c.op for c in s.collectives] == ["recv"]


def test_step_windows_follow_the_first_kernel_launched_inside_each_cpu_step() -> None:
    b = TraceBuilder()
    b.profiler_step(7, 0.0, 50.0)
    b.profiler_step(8, 50.0, 100.0)
    b.kernel(20.0, 100.0, launch_at=None)  # launched before profiling: anchors nothing
    b.kernel(300.0, 10.0, launch_at=40.0)  # step 7's only kernel, late on the device
    b.kernel(200.0, 10.0, launch_at=60.0, stream=8)  # step 8 starts before step 7's on device
    b.kernel(250.0, 30.0, launch_at=70.0)
    steps = analyze_trace(b.build()).steps
    # Step 7 would end before it starts: windows stay disjoint, so only step 8 survives.
    assert [s.step for s in steps] == [8]
    b2 = TraceBuilder()
    b2.profiler_step(7, 0.0, 50.0)
    b2.profiler_step(8, 50.0, 100.0)
    b2.kernel(20.0, 100.0, launch_at=None)
    b2.kernel(130.0, 10.0, launch_at=40.0)
    b2.kernel(200.0, 10.0, launch_at=60.0)
    b2.kernel(250.0, 30.0, launch_at=70.0)
    first, second = analyze_trace(b2.build()).steps
    assert (first.step, first.wall_s) == (7, approx(70.0 * US))  # [130, 200)
    assert (second.step, second.wall_s) == (8, approx(80.0 * US))  # [200, 280)
    assert second.bubble_idle_s == approx(40.0 * US)


@pytest.mark.parametrize("metadata", ["kernel", "rpc", "rpc_enclosing"])
def test_collective_metadata_from_kernel_args_or_record_param_comms(metadata: str) -> None:
    b = builder()
    b.comm_kernel(
        100.0,
        10.0,
        op="reduce_scatter",
        group=TP,
        nelems=100,
        dtype="BFloat16",
        metadata=metadata,
        launch_at=10.0,
    )
    (record,) = one_step(b).collectives
    assert (record.op, record.axis, record.tier, record.group_size) == (
        "reduce_scatter",
        "tp",
        "intra_node",
        2,
    )
    assert record.bytes == 2 * 100 * 2  # the full input array


def test_kernel_without_metadata_is_comm_time_but_needs_an_op_for_a_record() -> None:
    b = builder()
    b.comm_kernel(100.0, 10.0, op="all_reduce", metadata="none", launch_at=10.0)
    b.comm_kernel(
        120.0,
        10.0,
        op="send",
        metadata="none",
        launch_at=11.0,
        kernel_name="ncclDevKernel_Generic(ncclDevKernelArgsStorage<4096ul>)",
    )
    s = one_step(b)
    assert s.exposed_comm_s == approx(20.0 * US)
    assert [(e.axis, e.tier) for e in s.exposed_comm] == [("unknown", "unknown")]
    (record,) = s.collectives  # the Generic kernel says nothing about its op
    assert (record.op, record.bytes, record.busbw_bytes_per_s) == ("all_reduce", None, None)


def test_barrier_occupies_the_timeline_but_is_no_collective() -> None:
    b = builder()
    b.comm_kernel(100.0, 10.0, op="barrier", launch_at=10.0, group=TP)
    s = one_step(b)
    assert s.exposed_comm_s == approx(10.0 * US)
    assert s.collectives == ()


@pytest.mark.parametrize(
    ("options", "group", "tier"),
    [
        (AnalysisOptions(), DP, "inter_node"),  # 0 and 8 on hosts 0 and 1 (8 per node)
        (AnalysisOptions(gpus_per_node=16), DP, "intra_node"),
        (AnalysisOptions(host_of_rank={0: "a", 8: "a"}), DP, "intra_node"),
        (AnalysisOptions(host_of_rank={0: "a", 8: "b"}), DP, "inter_node"),
        (AnalysisOptions(host_of_rank={0: "a"}), DP, "unknown"),
        (AnalysisOptions(gpus_per_node=1), TP, "inter_node"),
    ],
)
def test_tier_from_group_ranks_and_topology(
    options: AnalysisOptions, group: Group, tier: str
) -> None:
    b = builder()
    b.comm_kernel(100.0, 10.0, group=group, launch_at=10.0)
    (record,) = one_step(b, options).collectives
    assert record.tier == tier


def test_axis_names_and_overrides() -> None:
    b = TraceBuilder(
        world_size=16,
        groups=(Group("0", "default_pg", tuple(range(16))), Group("5", "custom", (0, 1)), TP),
    )
    b.profiler_step(1, 0.0, 50.0)
    b.comm_kernel(100.0, 10.0, group=b.groups[0], launch_at=1.0)
    b.comm_kernel(110.0, 10.0, group=b.groups[1], launch_at=2.0)
    b.comm_kernel(120.0, 10.0, group=TP, launch_at=3.0)
    axes = [c.axis for c in one_step(b).collectives]
    assert axes == ["world", "custom", "tp"]
    overridden = one_step(b, AnalysisOptions(axis_overrides={"5": "ep", "mesh_tp": "cp"}))
    assert [c.axis for c in overridden.collectives] == ["world", "ep", "cp"]


def test_truncated_ranks_fall_back_to_pg_config() -> None:
    big = Group("9", "mesh_dp", tuple(range(0, 64, 2)))  # 32 ranks: torch truncates at 30
    b = TraceBuilder(world_size=64, groups=(big,))
    b.profiler_step(1, 0.0, 50.0)
    b.comm_kernel(100.0, 10.0, group=big, launch_at=1.0)
    trace = b.build()
    kernel = next(e for e in trace["traceEvents"] if e.get("cat") == "kernel")
    kernel["args"]["Process Group Ranks"] = "[0, 2, 4, ...]"
    (record,) = analyze_trace(trace, AnalysisOptions(gpus_per_node=64)).steps[0].collectives
    assert (record.group_size, record.tier) == (32, "intra_node")
    del trace["distributedInfo"]["pg_config"]
    (record,) = analyze_trace(trace, AnalysisOptions(gpus_per_node=8)).steps[0].collectives
    assert (record.group_size, record.tier) == (32, "unknown")


@pytest.mark.parametrize(
    ("model", "recompute", "peak", "mfu", "hfu"),
    [
        (1e9, 5e8, 1e13, 1e9 / (1e13 * 100e-6), 1.5e9 / (1e13 * 100e-6)),
        (1e9, None, 1e13, 1e9 / (1e13 * 100e-6), None),  # recompute seen, FLOPs not told
        (None, 5e8, 1e13, None, None),
        (1e9, 5e8, None, None, None),
    ],
)
def test_mfu_and_hfu(
    model: float | None, recompute: float | None, peak: float | None, mfu: float, hfu: float
) -> None:
    b = builder()
    b.annotation("mfuscope::recompute", 20.0, 30.0, MAIN_TID)
    b.kernel(100.0, 50.0, launch_at=1.0)
    b.kernel(150.0, 50.0, launch_at=25.0, recompute=True)
    s = one_step(
        b,
        AnalysisOptions(
            model_flops_per_step=model, recompute_flops_per_step=recompute, peak_flops=peak
        ),
    )
    assert s.recompute_s == approx(50.0 * US)
    assert s.mfu == (None if mfu is None else approx(mfu))
    assert s.hfu == (None if hfu is None else approx(hfu))


def test_reentrant_checkpoint_recompute_excludes_the_nested_backward() -> None:
    b = builder()
    b.cpu_op("autograd::engine::evaluate_function: CheckpointFunctionBackward", 9.0, 41.0)
    b.cpu_op("CheckpointFunctionBackward", 10.0, 40.0)
    b.cpu_op("autograd::engine::evaluate_function: AddmmBackward0", 25.0, 35.0)
    b.kernel(100.0, 10.0, launch_at=12.0, recompute=True)  # forward re-run: recompute
    b.kernel(110.0, 10.0, launch_at=30.0)  # the segment's backward: compute
    s = one_step(b)
    assert s.recompute_s == approx(10.0 * US) and s.compute_s == approx(10.0 * US)


def test_python_stack_recompute_fn_marks_recompute() -> None:
    b = builder()
    b.python_function("torch/utils/checkpoint.py(1500): recompute_fn", 10.0, 20.0, AUTOGRAD_TID)
    b.kernel(100.0, 10.0, launch_at=15.0, launch_tid=AUTOGRAD_TID, recompute=True)
    b.kernel(110.0, 10.0, launch_at=15.0, launch_tid=MAIN_TID)  # other thread: compute
    s = one_step(b)
    assert s.recompute_s == approx(10.0 * US) and s.compute_s == approx(10.0 * US)


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda t: t.__setitem__("traceEvents", []), "no device timeline"),
        (lambda t: t["traceEvents"].append({"cat": "kernel", "ph": "X", "pid": 0}), "malformed"),
        (lambda t: t.__setitem__("traceEvents", {}), "no traceEvents"),
        (lambda t: t.__setitem__("distributedInfo", {"rank": "zero"}), "distributedInfo.rank"),
    ],
)
def test_unusable_traces_raise_trace_error(mutate: object, message: str) -> None:
    b = builder()
    b.kernel(100.0, 10.0, launch_at=1.0)
    trace = b.build()
    mutate(trace)  # type: ignore[operator]
    with pytest.raises(TraceError, match=message) as info:
        analyze_trace(trace)
    assert info.value.path is None


def test_steps_without_device_activity_are_skipped_and_sum_is_exact() -> None:
    b = TraceBuilder()
    b.profiler_step(1, 0.0, 50.0)
    b.profiler_step(2, 50.0, 100.0)  # launches nothing
    b.profiler_step(3, 100.0, 150.0)
    b.kernel(200.0, 0.1, launch_at=1.0)
    b.kernel(300.3, 0.7, launch_at=120.0)
    b.comm_kernel(300.5, 3.3, launch_at=121.0)
    steps = analyze_trace(b.build()).steps
    assert [s.step for s in steps] == [1, 3]
    for s in steps:
        parts = (s.compute_s, s.recompute_s, s.exposed_comm_s, s.other_s, s.bubble_s)
        assert math.fsum(parts) == approx(s.wall_s)
