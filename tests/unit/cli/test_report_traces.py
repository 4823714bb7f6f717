"""Trace analyses as report input: the engine's steps become valid schema step reports."""

from __future__ import annotations

import math

import pytest
from mfuscope.cli.report._load import TraceOptions
from mfuscope.cli.report._traces import run_from_analyses, step_report_from_decomposition
from mfuscope.core.schema import ReportBatch, decode_batch, encode_batch
from mfuscope.core.trace import CollectiveRecord, ExposedComm, RankAnalysis, StepDecomposition


def _record(op: str, size: int | None, seconds: float, overlapped: float) -> CollectiveRecord:
    return CollectiveRecord(op, "dp", "intra_node", 2, size, seconds, None, None, overlapped)


STEP = StepDecomposition(
    step=5,
    start_s=1_700_000_000.5,
    wall_s=0.1,
    compute_s=0.05,
    recompute_s=0.01,
    exposed_comm_s=0.02,
    other_s=0.0,
    bubble_s=0.02,
    bubble_pipeline_s=0.005,
    bubble_idle_s=0.015,
    overlapped_comm_s=0.03,
    exposed_comm=(ExposedComm("dp", "intra_node", 0.015), ExposedComm("pp", "intra_node", 0.005)),
    collectives=(
        _record("all_reduce", 1024, 0.01, 0.5),
        _record("all_reduce", 1024, 0.03, 0.0),
        _record("all_reduce", 4096, 0.02, 1.0),
        _record("broadcast", None, 0.001, 0.0),
    ),
    mfu=None,
    hfu=None,
)


def test_a_decomposed_step_becomes_a_valid_step_report() -> None:
    options = TraceOptions(model_flops_per_step=2e12, recompute_flops_per_step=1e11)
    report = step_report_from_decomposition(STEP, options)
    assert math.fsum(c.seconds for c in report.components) == pytest.approx(STEP.wall_s)
    assert {(c.component, c.axis) for c in report.components} == {
        ("compute", ""),
        ("recompute", ""),
        ("bubble_pipeline", ""),
        ("bubble_idle", ""),
        ("exposed_comm", "dp"),
        ("exposed_comm", "pp"),
    }  # zero buckets (other) are left out
    merged = {(c.op, c.bytes): c for c in report.collectives}
    assert merged[("all_reduce", 1024)].count == 2
    assert merged[("all_reduce", 1024)].seconds == pytest.approx(0.04)
    assert merged[("all_reduce", 1024)].overlapped_s == pytest.approx(0.005)
    assert merged[("all_reduce", 4096)].overlapped_s == pytest.approx(0.02)
    assert merged[("broadcast", None)].count == 1
    assert (report.model_flops, report.recompute_flops) == (2e12, 1e11)
    # The collector's own parser accepts it (components sum to wall_s, overlap <= duration, ...).
    batch = ReportBatch(
        job="t",
        rank=0,
        world_size=1,
        host="h",
        device="dev",
        peak_flops=1e12,
        peak_source="user",
        sent_unix_ns=0,
        reports=(report,),
    )
    assert decode_batch(encode_batch(batch)).reports == (report,)


def test_ranks_gather_into_one_run_and_flops_knowledge_is_kept() -> None:
    analyses = [
        RankAnalysis(rank=1, world_size=2, device="NVIDIA A100-SXM4-80GB", steps=(STEP,)),
        RankAnalysis(rank=0, world_size=2, device="NVIDIA A100-SXM4-80GB", steps=(STEP,)),
    ]
    run = run_from_analyses(analyses, TraceOptions(peak_flops=312e12), "job", "traces")
    assert [r.rank for r in run.ranks] == [0, 1]
    assert not run.flops_known and run.ranks[0].peak_source == "user"
    topology = run.ranks[0].topology
    assert topology is not None
    # A known GPU: its reference design's intra-node link (A100: NVLink 3) is the spec line.
    (group,) = topology.groups
    assert (group.axis, group.tier, group.size) == ("dp", "intra_node", 2)
    assert group.link_peak_bytes_per_s == pytest.approx(300e9)  # 12 NVLink3 links x 25e9
    assert group.link_peak_source == "datasheet"
    cpu = run_from_analyses([RankAnalysis(0, 1, "cpu", (STEP,))], TraceOptions(), "j", "t")
    assert cpu.ranks[0].topology is not None
    assert cpu.ranks[0].topology.groups[0].link_peak_bytes_per_s is None  # no guessed spec
    assert cpu.ranks[0].topology.groups[0].link_peak_source == "unknown"
    with pytest.raises(ValueError, match="several traces of rank 1: trace 1, trace 2"):
        run_from_analyses([analyses[0], analyses[0]], TraceOptions(), "j", "t")
