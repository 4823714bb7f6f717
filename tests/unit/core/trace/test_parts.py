"""Tables for the engine's small parts: op names, dtypes, ranks, intervals, JSON contract."""

from __future__ import annotations

import itertools
import json
import math
import random

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from mfuscope.core.trace import analysis_to_json, analyze_trace
from mfuscope.core.trace._collectives import (
    BOOKKEEPING,
    dtype_size,
    normalise_op,
    op_from_kernel_name,
    parse_ranks,
)
from mfuscope.core.trace._intervals import IntervalSet, Spans, subtract, union

from tests.support.trace_builder import TraceBuilder


@pytest.mark.parametrize(
    ("name", "op"),
    [
        ("allreduce", "all_reduce"),
        ("allreduce_coalesced", "all_reduce"),
        ("_allgather_base", "all_gather"),
        ("allgather_into_tensor_coalesced", "all_gather"),
        ("all_gather", "all_gather"),
        ("_reduce_scatter_base", "reduce_scatter"),
        ("reduce_scatter_tensor_coalesced", "reduce_scatter"),
        ("all_to_all", "all_to_all"),
        ("alltoall_base", "all_to_all"),
        ("all_to_all_single", "all_to_all"),
        ("broadcast", "broadcast"),
        ("reduce", "reduce"),
        ("send", "send"),
        ("recv", "recv"),
        ("gloo:all_reduce", "all_reduce"),
        ("gloo:recv", "recv"),
        ("wait", BOOKKEEPING),
        ("barrier", BOOKKEEPING),
        ("gloo:barrier", BOOKKEEPING),
        ("coalesced", None),
        ("gather", None),
        ("scatter", None),
    ],
)
def test_op_names_normalise_to_nccl_tests(name: str, op: str | None) -> None:
    assert normalise_op(name) == op


@pytest.mark.parametrize(
    ("kernel", "op"),
    [
        (
            "ncclKernel_AllReduce_RING_LL_Sum_float(ncclDevComm*, unsigned long, ncclWork*)",
            "all_reduce",
        ),
        (
            "ncclKernel_Broadcast_RING_LL_Sum_int8_t(ncclDevComm*, unsigned long, ncclWork*)",
            "broadcast",
        ),
        ("ncclDevKernel_AllGather_RING_LL(ncclDevKernelArgsStorage<4096ul>)", "all_gather"),
        (
            "ncclDevKernel_ReduceScatter_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)",
            "reduce_scatter",
        ),
        ("ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<4096ul>)", None),
        ("ncclDevKernel_Generic(ncclDevKernelArgsStorage<4096ul>)", None),
        # communication kernels beyond NCCL spell the op in their callee's words
        (
            "void (anonymous namespace)::two_shot_all_reduce_kernel_inplace<c10::BFloat16, 16, 2>"
            "(c10::BFloat16**, unsigned long)",
            "all_reduce",
        ),
        ("void vllm::cross_device_reduce_1stage<__half, 8>(vllm::RankData*)", "all_reduce"),
        ("void (anonymous namespace)::multimem_all_gather_kernel<16>(char*)", "all_gather"),
        (
            "void alltoall_on_stream_kernel<char>(int, char*, char const*, unsigned long)",
            "all_to_all",
        ),
        ("void deep_ep::intranode::dispatch<8>(int4*, float*)", "all_to_all"),
        ("void c10d::nvshmem_extension::exchangeSplitAndOffsetKernel(long*, long*)", None),
    ],
)
def test_op_from_kernel_name(kernel: str, op: str | None) -> None:
    assert op_from_kernel_name(kernel) == op


@pytest.mark.parametrize(
    ("dtype", "size"),
    [
        ("Float", 4),
        ("BFloat16", 2),
        ("Half", 2),
        ("Long", 8),
        ("Byte", 1),
        ("Double", 8),
        ("float", 4),
        ("c10::BFloat16", 2),
        ("long int", 8),
        ("c10::Half", 2),
        ("int", 4),
        ("Float8_e4m3fn", 1),
        ("Quaternion", None),
        (None, None),
    ],
)
def test_dtype_sizes(dtype: object, size: int | None) -> None:
    assert dtype_size(dtype) == size


@pytest.mark.parametrize(
    ("value", "ranks"),
    [
        ("[0, 1]", (0, 1)),
        ('"[0, 8, 16]"', (0, 8, 16)),
        ([2, 3], (2, 3)),
        ("[]", ()),
        ("[0, 1, 2, ...]", None),
        ("0,1", None),
        ("[a]", None),
        (None, None),
    ],
)
def test_parse_ranks(value: object, ranks: tuple[int, ...] | None) -> None:
    assert parse_ranks(value) == ranks


intervals = st.lists(
    st.tuples(st.integers(0, 60), st.integers(0, 20)).map(
        lambda t: (float(t[0]), float(t[0] + t[1]))
    ),
    max_size=12,
)


def _points(ivs: list[tuple[float, float]]) -> set[int]:
    return {t for a, b in ivs for t in range(int(a), int(b))}


@given(intervals, intervals, st.integers(0, 80), st.integers(0, 80))
def test_interval_algebra_matches_unit_cells(
    a: list[tuple[float, float]], b: list[tuple[float, float]], lo: int, hi: int
) -> None:
    ua, ub = union(a), union(b)
    assert _points(ua) == _points(a)
    assert all(x[1] < y[0] for x, y in itertools.pairwise(ua))  # disjoint, sorted, merged
    assert _points(subtract(ua, ub)) == _points(a) - _points(b)
    expected = len({t for t in _points(a) if lo <= t < hi})
    measured = IntervalSet(Spans.from_pairs(ua)).measure_each(np.array([lo]), np.array([hi]))
    assert measured.tolist() == [expected]


def _trace() -> dict[str, object]:
    b = TraceBuilder()
    b.profiler_step(2, 0.0, 10.0)
    b.kernel(20.0, 5.0, launch_at=1.0)
    b.comm_kernel(22.0, 10.0, launch_at=2.0)
    b.comm_kernel(40.0, 1.0, launch_at=3.0, metadata="none", kernel_name="ncclDevKernel_Generic")
    b.comm_kernel(50.0, 1.0, launch_at=4.0, op="broadcast", metadata="none")
    return b.build()


def test_json_document_has_exactly_the_contract_keys() -> None:
    doc = analysis_to_json([analyze_trace(_trace())])
    json.dumps(doc, allow_nan=False)
    assert set(doc) == {"schema", "warnings", "ranks"} and doc["schema"] == "mfuscope.analysis/1"
    (rank,) = doc["ranks"]
    assert set(rank) == {"rank", "world_size", "device", "warnings", "steps"}
    assert rank["warnings"] == []
    (step,) = rank["steps"]
    assert set(step) == {
        "step",
        "window_source",
        "start_s",
        "wall_s",
        "compute_s",
        "recompute_s",
        "exposed_comm_s",
        "other_s",
        "bubble_s",
        "bubble_pipeline_s",
        "bubble_idle_s",
        "overlapped_comm_s",
        "exposed_comm",
        "collectives",
        "mfu",
        "hfu",
        "compute_class_s",
        "recompute_class_s",
        "waterfall",
    }
    assert step["waterfall"] is None  # no FLOPs given
    classes = {"gemm", "attention", "elementwise_norm_reduce", "other"}
    assert set(step["compute_class_s"]) == set(step["recompute_class_s"]) == classes
    assert math.fsum(step["compute_class_s"].values()) == pytest.approx(step["compute_s"])
    assert step["mfu"] is None and step["hfu"] is None
    assert {tuple(sorted(e)) for e in step["exposed_comm"]} == {("axis", "seconds", "tier")}
    first, unknown = step["collectives"]
    assert set(first) == {
        "op",
        "axis",
        "tier",
        "group_size",
        "group_size_reason",
        "bytes",
        "seconds",
        "algbw_bytes_per_s",
        "busbw_bytes_per_s",
        "overlapped_ratio",
    }
    assert unknown["bytes"] is None and unknown["busbw_bytes_per_s"] is None
    assert step["window_source"] == "profiler_step"


def test_json_of_several_ranks_keeps_their_order() -> None:
    # Four distinct ranks in a shuffled order: the document lists them as given, never sorted
    # (the caller chose the order, e.g. the files' order on the command line).
    ranks = []
    for rank in range(4):
        b = TraceBuilder(rank=rank, world_size=4)
        b.profiler_step(2, 0.0, 10.0)
        b.kernel(1.0, 1.0 + rank, launch_at=0.5)  # each rank's compute differs
        ranks.append(analyze_trace(b.build()))
    compute_of_rank = {r.rank: r.steps[0].compute_s for r in ranks}
    assert len(set(compute_of_rank.values())) == 4
    random.Random(0).shuffle(ranks)
    order = [r.rank for r in ranks]
    assert order != sorted(order)
    doc_ranks = analysis_to_json(ranks)["ranks"]
    assert [r["rank"] for r in doc_ranks] == order
    assert [r["steps"][0]["compute_s"] for r in doc_ranks] == [compute_of_rank[k] for k in order]
