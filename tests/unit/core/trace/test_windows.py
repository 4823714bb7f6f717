"""Traces users bring beyond profiled training steps: windows, device kinds, missing timelines.

Each trace is built from event shapes real traces have; where each shape comes from is said at
its builder. Every answer is checked both from the dict (`analyze_trace`) and through the fast
reader (`read_trace`, the C selection), and its buckets must sum to its window.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
from mfuscope.core.trace import AnalysisOptions, RankAnalysis, TraceError, analyze_trace, read_trace
from mfuscope.core.trace.inputs import input_warnings

from tests.support.trace_builder import CPU_PID, DEVICE, MAIN_TID, Group, TraceBuilder

US = 1e-6


def both_ways(
    trace: dict[str, Any], tmp_path: Path, options: AnalysisOptions | None = None
) -> RankAnalysis:
    """The analysis of `trace`, identical from the dict and from the file through `read_trace`."""
    options = options or AnalysisOptions()
    from_dict = analyze_trace(trace, options)
    path = tmp_path / "trace.json"
    path.write_text(json.dumps(trace))
    assert analyze_trace(read_trace(path), options) == from_dict
    for step in from_dict.steps:
        parts = (step.compute_s, step.recompute_s, step.exposed_comm_s, step.other_s, step.bubble_s)
        assert math.fsum(parts) == pytest.approx(step.wall_s, rel=1e-12, abs=1e-15)
    return from_dict


def eager(with_steps: bool = False) -> TraceBuilder:
    """Single-GPU eager run: kernels launched by cudaLaunchKernel (the builder's shapes, checked
    against the real traces in the shared set)."""
    b = TraceBuilder(world_size=1, groups=(Group("0", "default_pg", (0,)),))
    if with_steps:
        b.profiler_step(1, 0.0, 50.0)
    b.kernel(100.0, 40.0, launch_at=1.0)
    b.kernel(160.0, 20.0, launch_at=2.0)
    b.memcpy(190.0, 10.0, launch_at=3.0)
    return b


def test_no_profiler_step_is_the_whole_device_span_as_one_window(tmp_path: Path) -> None:
    (step,) = both_ways(eager().build(), tmp_path).steps
    assert step.window_source == "whole_trace"
    assert step.wall_s == pytest.approx(100 * US)  # first kernel start 100 .. memcpy end 200
    assert step.compute_s == pytest.approx(60 * US) and step.other_s == pytest.approx(10 * US)
    assert step.bubble_s == pytest.approx(30 * US)


def test_profiler_steps_still_win_over_the_whole_trace(tmp_path: Path) -> None:
    (step,) = both_ways(eager(with_steps=True).build(), tmp_path).steps
    assert (step.step, step.window_source) == (1, "profiler_step")


def test_gpu_only_trace_without_host_events(tmp_path: Path) -> None:
    # Kernels with no launch (a device-only capture, e.g. nsys-converted or CUPTI-only).
    b = TraceBuilder(world_size=1)
    b.kernel(10.0, 5.0)
    b.kernel(20.0, 5.0)
    (step,) = both_ways(b.build(), tmp_path).steps
    assert step.window_source == "whole_trace" and step.wall_s == pytest.approx(15 * US)


def cuda_graph_replay(
    b: TraceBuilder, launch_at: float, kernels: list[tuple[float, float]]
) -> None:
    """One ``cudaGraphLaunch`` and the kernels of its graph, all carrying the launch's
    correlation id (how Kineto/CUPTI link graph kernels; HolisticTraceAnalysis and TraceLens
    read graph replays the same way)."""
    correlation = 90_000 + int(launch_at)
    b.events.append(
        {
            "ph": "X",
            "cat": "cuda_runtime",
            "name": "cudaGraphLaunch",
            "pid": CPU_PID,
            "tid": MAIN_TID,
            "ts": launch_at,
            "dur": 5.0,
            "args": {"cbid": 311, "correlation": correlation},
        }
    )
    for start, dur in kernels:
        b.events.append(
            {
                "ph": "X",
                "cat": "kernel",
                "name": "void at::native::vectorized_elementwise_kernel",
                "pid": DEVICE,
                "tid": 7,
                "ts": start,
                "dur": dur,
                "args": {"device": DEVICE, "stream": 7, "correlation": correlation, "graph id": 1},
            }
        )


def test_cuda_graph_replays_fall_in_the_step_that_launched_them(tmp_path: Path) -> None:
    b = TraceBuilder(world_size=1)
    b.profiler_step(1, 0.0, 50.0)
    b.profiler_step(2, 50.0, 100.0)
    cuda_graph_replay(b, 10.0, [(200.0, 10.0), (210.0, 10.0), (230.0, 10.0)])
    cuda_graph_replay(b, 60.0, [(300.0, 10.0), (315.0, 5.0)])
    first, second = both_ways(b.build(), tmp_path).steps
    assert (first.step, second.step) == (1, 2)
    assert first.compute_s == pytest.approx(30 * US) and first.wall_s == pytest.approx(100 * US)
    assert second.compute_s == pytest.approx(15 * US) and second.wall_s == pytest.approx(20 * US)


def test_triton_kernels_launched_through_the_driver(tmp_path: Path) -> None:
    # torch.compile/Inductor launches Triton kernels with the driver's cuLaunchKernel
    # (category cuda_driver); names such as triton_poi_fused_* / triton_red_fused_*.
    b = TraceBuilder(world_size=1)
    b.profiler_step(1, 0.0, 50.0)
    for i, (name, start) in enumerate(
        (("triton_poi_fused_add_0", 100.0), ("triton_red_fused_sum_1", 120.0))
    ):
        correlation = 70_000 + i
        b.events.append(
            {
                "ph": "X",
                "cat": "cuda_driver",
                "name": "cuLaunchKernel",
                "pid": CPU_PID,
                "tid": MAIN_TID,
                "ts": 5.0 + i,
                "dur": 2.0,
                "args": {"correlation": correlation},
            }
        )
        b.events.append(
            {
                "ph": "X",
                "cat": "kernel",
                "name": name,
                "pid": DEVICE,
                "tid": 7,
                "ts": start,
                "dur": 10.0,
                "args": {"device": DEVICE, "stream": 7, "correlation": correlation},
            }
        )
    (step,) = both_ways(b.build(), tmp_path).steps
    assert step.window_source == "profiler_step"
    assert step.wall_s == pytest.approx(30 * US) and step.compute_s == pytest.approx(20 * US)


def test_window_annotation_on_the_host_anchors_like_a_step(tmp_path: Path) -> None:
    # sglang-style inference: record_function ranges ("prefill", "decode") and no ProfilerStep.
    b = TraceBuilder(world_size=1)
    b.annotation("prefill", 0.0, 10.0)
    b.kernel(100.0, 50.0, launch_at=5.0)
    b.annotation("decode", 20.0, 30.0)
    b.kernel(160.0, 10.0, launch_at=25.0)
    b.annotation("decode", 40.0, 50.0)
    b.kernel(200.0, 10.0, launch_at=45.0)
    options = AnalysisOptions(window_annotation="decode")
    steps = both_ways(b.build(), tmp_path, options).steps
    assert [(s.step, s.window_source) for s in steps] == [(0, "annotation:decode")] * 1 + [
        (1, "annotation:decode")
    ]
    assert steps[0].wall_s == pytest.approx(40 * US)  # until the next decode's first kernel
    assert steps[1].wall_s == pytest.approx(10 * US)
    with pytest.raises(TraceError, match=r"'verify'.*no such annotation.*decode, prefill"):
        analyze_trace(b.build(), AnalysisOptions(window_annotation="verify"))


def test_window_annotation_on_the_device_only(tmp_path: Path) -> None:
    # gpu_user_annotation: the device-side copy of a record_function range Kineto writes.
    b = eager()
    b.events.append(
        {
            "ph": "X",
            "cat": "gpu_user_annotation",
            "name": "attn",
            "pid": DEVICE,
            "tid": 7,
            "ts": 150.0,
            "dur": 50.0,
            "args": {"External id": 1},
        }
    )
    (step,) = both_ways(b.build(), tmp_path, AnalysisOptions(window_annotation="attn")).steps
    assert step.window_source == "annotation:attn" and step.wall_s == pytest.approx(50 * US)
    assert step.compute_s == pytest.approx(20 * US) and step.other_s == pytest.approx(10 * US)


def test_window_range(tmp_path: Path) -> None:
    options = AnalysisOptions(window_range_us=(120.0, 170.0))
    (step,) = both_ways(eager(with_steps=True).build(), tmp_path, options).steps
    assert step.window_source == "range" and step.wall_s == pytest.approx(50 * US)
    assert step.compute_s == pytest.approx(30 * US) and step.bubble_s == pytest.approx(20 * US)
    with pytest.raises(ValueError, match="end after"):
        AnalysisOptions(window_range_us=(5.0, 5.0))


def test_mtia_device_events_are_the_device_timeline(tmp_path: Path) -> None:
    # MTIA: device work in category mtia_ccp_events, launched from mtia_runtime (libkineto
    # ActivityType names MTIA_CCP_EVENTS / MTIA_RUNTIME).
    b = TraceBuilder(world_size=1, gpu=False)
    b.profiler_step(1, 0.0, 50.0)
    b.cpu_op("aten::mm", 1.0, 49.0)  # host work: would be 98% "compute" read as a CPU job
    for i, (start, dur) in enumerate(((100.0, 30.0), (150.0, 25.0))):
        b.events.append(
            {
                "ph": "X",
                "cat": "mtia_runtime",
                "name": "launchKernel",
                "pid": CPU_PID,
                "tid": MAIN_TID,
                "ts": 2.0 + i,
                "dur": 1.0,
                "args": {"correlation": 500 + i},
            }
        )
        b.events.append(
            {
                "ph": "X",
                "cat": "mtia_ccp_events",
                "name": f"mtia_kernel_{i}",
                "pid": 3,
                "tid": 1,
                "ts": start,
                "dur": dur,
                "args": {"correlation": 500 + i},
            }
        )
    result = both_ways(b.build(), tmp_path)
    (step,) = result.steps
    assert result.device != "cpu" and not result.warnings
    assert step.wall_s == pytest.approx(75 * US) and step.compute_s == pytest.approx(55 * US)


def nccl_job_without_kernels() -> dict[str, Any]:
    """An 8-GPU NCCL job whose device events were lost: ProcessGroupNCCL's ``nccl:all_to_all``
    ranges and ``record_param_comms`` on the host, deviceProperties, backend nccl, no kernels."""
    b = TraceBuilder(world_size=8, groups=(Group("0", "default_pg", tuple(range(8))),))
    b.profiler_step(1, 0.0, 100.0)
    b.cpu_op("aten::mm", 1.0, 40.0)
    b.annotation("nccl:all_to_all", 41.0, 60.0)
    b.cpu_op("record_param_comms", 42.0, 59.0, **{"Collective name": "all_to_all"})
    return b.build()


def test_nccl_job_without_kernels_is_answered_with_a_warning(tmp_path: Path) -> None:
    result = both_ways(nccl_job_without_kernels(), tmp_path)
    (warning,) = result.warnings
    assert "no device events" in warning and "nccl:all_to_all x1" in warning
    assert "host timeline" in warning


def test_device_events_of_a_kind_not_read_are_refused() -> None:
    b = TraceBuilder(world_size=1, gpu=False)
    b.profiler_step(1, 0.0, 50.0)
    b.cpu_op("aten::mm", 1.0, 49.0)
    b.events.append(
        {"ph": "X", "cat": "hpu_op", "name": "x", "pid": 5, "tid": 1, "ts": 3.0, "dur": 4.0}
    )
    with pytest.raises(TraceError, match=r"does not read \(hpu_op x1\)"):
        analyze_trace(b.build())


def test_gpu_trace_with_no_timeline_at_all_is_refused() -> None:
    trace = TraceBuilder(world_size=2).build()  # deviceProperties, backend nccl, no events
    with pytest.raises(TraceError, match=r"^no device timeline"):
        analyze_trace(trace)


def test_cpu_job_without_steps_is_the_whole_host_span(tmp_path: Path) -> None:
    b = TraceBuilder(world_size=1, gpu=False)
    b.cpu_op("aten::mm", 10.0, 30.0)
    b.cpu_op("aten::add", 40.0, 50.0)
    result = both_ways(b.build(), tmp_path)
    (step,) = result.steps
    assert (step.window_source, result.warnings) == ("whole_trace", ())
    assert step.wall_s == pytest.approx(40 * US) and step.compute_s == pytest.approx(30 * US)


def test_unknown_group_size_is_null_with_the_reason() -> None:
    b = TraceBuilder(world_size=16)
    b.profiler_step(1, 0.0, 50.0)
    b.comm_kernel(100.0, 10.0, launch_at=2.0, metadata="none")
    (record,) = analyze_trace(b.build()).steps[0].collectives
    assert record.group_size is None and record.busbw_bytes_per_s is None
    assert record.group_size_reason is not None and "record_param_comms" in record.group_size_reason


def test_input_warnings_name_duplicates_and_unrelated_ranks() -> None:
    one = analyze_trace(eager(with_steps=True).build())
    other = analyze_trace(TraceBuilder(world_size=4, rank=0).build() | nccl_job_without_kernels())
    lines = input_warnings([("a.json", one), ("b.json", one), ("c.json", other)])
    assert any("a.json and b.json hold the same trace" in line for line in lines)
    assert any(line.startswith("rank 0 appears in 2 different traces") for line in lines)
    assert any("disagree on the world size" in line for line in lines)
    assert input_warnings([("a.json", one)]) == []
