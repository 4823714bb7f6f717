"""Pipeline parallelism on NCCL: batched (coalesced) and single point-to-point, hand-computed.

The trace shapes are those of `torch.distributed.pipelining` on NCCL, built by
`TraceBuilder.coalesced_p2p` (which says where each name and arg comes from: ProcessGroupNCCL's
``startCoalescing`` / ``endCoalescing`` and ``send`` / ``recv``, the profiler's ``saveNcclMeta``,
NCCL's kernel names). In torch 2.13 a schedule's batch of only sends or only receives runs as
single isend/irecv (one ``record_param_comms`` around one kernel launch each); a batch that
mixes both (1F1B's steady state: send an activation, receive a gradient) runs as one coalesced
``batch_isend_irecv``.

The rank is global rank 0 of 4 on a ("dp", "pp") = (2, 2) DeviceMesh: the process groups of its
``distributedInfo.pg_config`` are the ones a real run of that mesh wrote (recorded here with
torch 2.13 on gloo: the default group, then each dim's group holding the rank).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from mfuscope.core.bandwidth import LinkModel, ideal_transfer_s
from mfuscope.core.trace import AnalysisOptions, StepDecomposition, analyze_trace, read_trace

from tests.support.trace_builder import Group, TraceBuilder

US = 1e-6
WORLD = Group("0", "default_pg", (0, 1, 2, 3))
DP = Group("1", "mesh_dp", (0, 2))
PP = Group("3", "mesh_pp", (0, 1))
SEND_RECV = "ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<4096ul>)"
ACTIVATION = 4 * 64  # elements of one micro-batch's activation (and of its gradient)


def approx(value: float) -> object:
    return pytest.approx(value, rel=1e-9, abs=1e-12)


def builder() -> TraceBuilder:
    b = TraceBuilder(rank=0, world_size=4, groups=(WORLD, DP, PP))
    b.profiler_step(1, 0.0, 90.0)
    return b


def one_step(b: TraceBuilder, options: AnalysisOptions | None = None) -> StepDecomposition:
    (step,) = analyze_trace(b.build(), options or AnalysisOptions()).steps
    return step


def one_f_one_b_step(b: TraceBuilder) -> None:
    """Stage 0's steady state, then the data-parallel gradient all-reduce.

    [100, 200) forward compute; [190, 590) the coalesced batch (send the activation to stage 1,
    receive its gradient from stage 1): 10 µs under compute, 390 µs exposed, waiting for stage 1;
    [590, 790) backward compute; [800, 830) a single isend (a gradient-free batch of one op:
    torch 2.13 runs it unbatched, its kernel launched inside its record_param_comms);
    [850, 950) the all-reduce of the stage's 33,088 gradients on the dp group.
    """
    b.kernel(100.0, 100.0, launch_at=10.0)
    b.coalesced_p2p(
        190.0,
        400.0,
        ops=(("send", 1, ACTIVATION), ("recv", 1, ACTIVATION)),
        group=PP,
        seq=7,
        launch_at=30.0,
    )
    b.kernel(590.0, 200.0, launch_at=40.0)
    b.comm_kernel(
        800.0,
        30.0,
        op="send",
        group=PP,
        nelems=ACTIVATION,
        metadata="rpc",
        launch_at=50.0,
        kernel_name=SEND_RECV,
    )
    b.comm_kernel(850.0, 100.0, op="all_reduce", group=DP, nelems=33_088, launch_at=60.0)


def test_coalesced_send_recv_wait_is_pipeline_bubble_on_pp() -> None:
    b = builder()
    one_f_one_b_step(b)
    s = one_step(b)  # no link models (a CPU-less synthetic trace gets none): all of it bubble
    assert s.wall_s == approx(850.0 * US)  # [100, 950)
    assert s.compute_s == approx(300.0 * US)
    # The batch's 390 exposed µs and the single isend's 30: all pipeline bubble.
    assert s.bubble_pipeline_s == approx(420.0 * US)
    # Only the all-reduce is exposed communication, on dp; nothing lands on `unknown`.
    assert [(e.axis, e.seconds) for e in s.exposed_comm] == [("dp", approx(100.0 * US))]
    assert s.bubble_idle_s == approx(30.0 * US)  # [790, 800) and [830, 850)
    assert s.overlapped_comm_s == approx(10.0 * US)
    total = s.compute_s + s.exposed_comm_s + s.bubble_pipeline_s + s.bubble_idle_s
    assert total == approx(s.wall_s)


def test_coalesced_batch_is_one_record_per_op_with_its_members_bytes() -> None:
    b = builder()
    one_f_one_b_step(b)
    records = [
        (c.op, c.axis, c.tier, c.group_size, c.bytes, c.seconds) for c in one_step(b).collectives
    ]
    activation_bytes = ACTIVATION * 4
    assert records == [
        # Both ops of the batch run in its one kernel: each over the kernel's 400 µs (records
        # in start order, ties by op name).
        ("recv", "pp", "intra_node", 2, activation_bytes, approx(400.0 * US)),
        ("send", "pp", "intra_node", 2, activation_bytes, approx(400.0 * US)),
        ("send", "pp", "intra_node", 2, activation_bytes, approx(30.0 * US)),
        ("all_reduce", "dp", "intra_node", 2, 33_088 * 4, approx(100.0 * US)),
    ]
    collectives = one_step(b).collectives
    # send/recv bus factor 1 (nccl-tests): busbw = algbw = bytes / seconds.
    assert collectives[1].busbw_bytes_per_s == approx(activation_bytes / (400.0 * US))
    (all_reduce,) = [c for c in collectives if c.op == "all_reduce"]
    # all_reduce on n = 2: bus factor 2(n-1)/n = 1.
    assert all_reduce.busbw_bytes_per_s == approx(all_reduce.algbw_bytes_per_s)


def test_ideal_transfer_of_each_op_of_a_batch_is_communication() -> None:
    """With a link model the batch's exposed 390 µs are shared by its two ops (195 µs each, as
    any collectives running at once); each counts as communication up to its own ideal time
    alpha + bytes / beta, the rest is pipeline bubble."""
    link = LinkModel(alpha_s=5e-6, beta_bytes_per_s=1e8)
    b = builder()
    one_f_one_b_step(b)
    s = one_step(b, AnalysisOptions(links={"intra_node": link}))
    ideal_us = ideal_transfer_s(link, ACTIVATION * 4) / US  # 5 + 1024 B / 100 MB/s = 15.24 µs
    assert ideal_us == approx(15.24)
    pp = [e.seconds for e in s.exposed_comm if e.axis == "pp"]
    # Two ops of the batch and the single isend, each its own ideal time.
    assert pp == [approx(3 * ideal_us * US)]
    assert s.bubble_pipeline_s == approx((420.0 - 3 * ideal_us) * US)


@pytest.mark.parametrize("seqs", [(3, 5), (None, None)])
def test_members_are_only_the_batch_s_own_ops(seqs: tuple[int | None, int | None]) -> None:
    """A single send just before a batch, and the batch before it, are not the batch's: the
    members come after the thread's previous communication launch, of one group and one Seq
    (older PyTorch records no Seq: the launch alone then bounds the batch)."""
    b = builder()
    b.kernel(100.0, 10.0, launch_at=5.0)
    first = (("send", 1, ACTIVATION), ("recv", 1, ACTIVATION))
    b.coalesced_p2p(110.0, 40.0, ops=first, group=PP, seq=seqs[0], launch_at=30.0)
    b.comm_kernel(150.0, 10.0, op="send", group=PP, nelems=8, metadata="rpc", launch_at=40.0)
    second = (("recv", 1, 2 * ACTIVATION),)
    b.coalesced_p2p(160.0, 40.0, ops=second, group=PP, seq=seqs[1], launch_at=60.0)
    records = [(c.op, c.bytes) for c in one_step(b).collectives]
    assert records == [
        ("recv", ACTIVATION * 4),
        ("send", ACTIVATION * 4),
        ("send", 8 * 4),
        ("recv", 2 * ACTIVATION * 4),
    ]


def test_several_sends_of_a_batch_add_up() -> None:
    b = builder()
    b.kernel(100.0, 10.0, launch_at=5.0)
    ops = (("send", 1, 100), ("recv", 1, 300), ("send", 1, 200))
    b.coalesced_p2p(110.0, 40.0, ops=ops, group=PP, seq=2, launch_at=30.0)
    records = [(c.op, c.axis, c.bytes) for c in one_step(b).collectives]
    assert records == [("recv", "pp", 300 * 4), ("send", "pp", 300 * 4)]


def test_send_recv_kernel_outside_a_batch_stays_unknown() -> None:
    """Without its ``nccl:coalesced`` annotation (or any metadata) a SendRecv kernel could be
    an all_to_all as well: no record, its exposed time is communication of axis unknown."""
    b = builder()
    b.kernel(100.0, 10.0, launch_at=5.0)
    b.comm_kernel(110.0, 40.0, op="send", metadata="none", launch_at=6.0, kernel_name=SEND_RECV)
    s = one_step(b)
    assert s.collectives == ()
    assert [(e.axis, e.seconds) for e in s.exposed_comm] == [("unknown", approx(40.0 * US))]
    assert s.bubble_pipeline_s == 0.0


def test_reading_the_file_keeps_what_a_batch_is_found_by(tmp_path: Path) -> None:
    """`read_trace` leaves out, before decoding, the events the analysis never reads: the
    batch's annotation, its record_param_comms and the driver launch stay."""
    b = builder()
    one_f_one_b_step(b)
    path = tmp_path / "trace.json"
    path.write_text(json.dumps(b.build()))
    read = analyze_trace(read_trace(path)).steps
    assert read == analyze_trace(b.build()).steps
    assert [c.op for c in read[0].collectives] == ["recv", "send", "send", "all_reduce"]
