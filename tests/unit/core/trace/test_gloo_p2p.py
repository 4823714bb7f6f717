"""gloo send/recv (pipeline traffic on CPU): their group, and the compute around an isend.

Shapes as torch 2.13 writes them for `torch.distributed.pipelining` on gloo (recorded here on a
2 x 2 ("dp", "pp") mesh): ``gloo:send`` / ``gloo:recv`` on the calling thread from the call until
``wait()``, starting inside the enqueueing ``c10d::send`` / ``c10d::recv_``; ``pg_config`` lists
the groups the rank belongs to (rank 0: the default group, its ``mesh_dp`` and ``mesh_pp``).
"""

from __future__ import annotations

import pytest
from mfuscope.core.trace import AnalysisOptions, StepDecomposition, analyze_trace

from tests.support.trace_builder import GLOO_TIDS, MAIN_TID, Group, TraceBuilder

US = 1e-6
WORLD = Group("0", "default_pg", (0, 1, 2, 3))
DP = Group("1", "mesh_dp", (0, 2))
PP = Group("3", "mesh_pp", (0, 1))


def approx(value: float) -> object:
    return pytest.approx(value, rel=1e-9, abs=1e-12)


def one_step(
    groups: tuple[Group, ...], options: AnalysisOptions | None = None
) -> StepDecomposition:
    """Stage 0 of a GPipe step: forward of micro-batch 0, isend of its activation (waited at
    the end of the forwards), forward of micro-batch 1 while that send is open, then a
    blocking wait for a gradient."""
    b = TraceBuilder(gpu=False, groups=groups, world_size=4)
    b.thread_name(GLOO_TIDS[0], "pt_gloo_runloop")
    b.profiler_step(1, 0.0, 200.0)
    b.cpu_op("aten::addmm", 10.0, 40.0)  # forward 0
    b.cpu_op("c10d::send", 40.0, 45.0)  # enqueue
    b.gloo("send", 44.0, 46.0, nelems=256, tid=MAIN_TID)  # [44, 90): open until its wait()
    b.cpu_op("aten::addmm", 50.0, 80.0)  # forward 1, while the send is open
    b.cpu_op("c10d::recv_", 95.0, 100.0)
    b.gloo("recv", 98.0, 82.0, nelems=256, tid=MAIN_TID)  # [98, 180): waits for stage 1
    b.cpu_op("aten::mm", 180.0, 200.0)  # backward
    (step,) = analyze_trace(b.build(), options or AnalysisOptions()).steps
    return step


def test_p2p_of_a_rank_with_one_pipeline_group_is_that_group_s() -> None:
    s = one_step((WORLD, DP, PP))
    records = [(c.op, c.axis, c.tier, c.group_size, c.bytes) for c in s.collectives]
    assert records == [("send", "pp", "intra_node", 2, 1024), ("recv", "pp", "intra_node", 2, 1024)]
    # Exposed p2p on pp with no link model (CPU): pipeline bubble. The send is exposed in
    # [44, 50) (the enqueue operator is cut out of compute) and [80, 90), the recv in [98, 180).
    assert s.bubble_pipeline_s == approx((6.0 + 10.0 + 82.0) * US)
    assert s.exposed_comm == ()


def test_operators_inside_an_open_isend_are_compute() -> None:
    s = one_step((WORLD, DP, PP))
    # [10, 40) + [50, 80) + [180, 200): forward 1 runs while the send is open.
    assert s.compute_s == approx(80.0 * US)
    assert s.overlapped_comm_s == approx(30.0 * US)
    assert s.bubble_idle_s == approx((10.0 + 4.0 + 8.0) * US)  # [0, 10), [40, 44), [90, 98)
    total = s.compute_s + s.exposed_comm_s + s.bubble_pipeline_s + s.bubble_idle_s
    assert total == approx(s.wall_s)


@pytest.mark.parametrize(
    ("groups", "axis", "size"),
    [
        # Several groups, none on pp: which one is not known; the sizes differ.
        ((WORLD, DP), "unknown", None),
        # Two pipeline groups (a rank in two pp groups): not decided either; same sizes.
        ((DP, PP, Group("4", "mesh_pp", (0, 3))), "unknown", 2),
        # One multi-rank group: that one, whatever its axis.
        ((WORLD,), "world", 4),
    ],
)
def test_p2p_group_undecided_without_exactly_one_pipeline_group(
    groups: tuple[Group, ...], axis: str, size: int | None
) -> None:
    s = one_step(groups)
    assert {(c.axis, c.group_size) for c in s.collectives} == {(axis, size)}
    if axis != "pp":
        assert s.bubble_pipeline_s == 0.0
        assert s.exposed_comm_s == approx(98.0 * US)


def test_megatron_style_pipeline_group_by_axis_override() -> None:
    """A pipeline group named otherwise is found once its name maps to pp (the user's axis
    mapping, or the agent's topology)."""
    pipeline = Group("3", "PIPELINE_MODEL_PARALLEL_GROUP", (0, 1))
    told = AnalysisOptions(axis_overrides={"PIPELINE_MODEL_PARALLEL_GROUP": "pp"})
    s = one_step((WORLD, DP, pipeline), told)
    assert {(c.axis, c.group_size) for c in s.collectives} == {("pp", 2)}
    assert s.bubble_pipeline_s > 0
