"""Counted FLOPs are each rank's own work under every parallel layout: one real 4-rank gloo job
(`tests/support/sharded_flops_job.py`) trains the same MLP under DTensor TP, TP + SP, TP with
activation checkpointing, FSDP2, FSDP2 + TP, a pipeline stage (GPipe, 1F1B), and with a batch
size that changes every step, into JSONL files and a real `mfuscope collector`; every step's
reported FLOPs, and the collector's per-job totals, are checked against counts derived here by
hand.

Hand derivation: a Linear(i, o) on n tokens costs 2*n*i*o forward (torch counts the matmul, not
the bias), and 2*n*i*o backward for its weight gradient plus 2*n*i*o for its input gradient
when its input needs one (not for the raw inputs). Tensor parallelism splits every matmul of the
MLP evenly over the tp ranks, so a rank's share is the whole divided by tp.
"""

from __future__ import annotations

import json
import subprocess
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support import sharded_flops_shape as job
from tests.support.collector_process import CollectorProcess
from tests.support.launch import job_command

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
JOB = ROOT / "tests" / "support" / "sharded_flops_job.py"
TOKENS = job.BATCH * job.SEQ  # per data-parallel rank and step
UP = job.IN * job.HIDDEN
DOWN = job.HIDDEN * job.OUT
TP = 2


def _mlp_step(tokens: int, up_input_grad: bool = False) -> int:
    """One training step of the whole MLP on `tokens` tokens (FLOPs)."""
    forward = 2 * tokens * (UP + DOWN)
    weight_grads = 2 * tokens * (UP + DOWN)
    input_grads = 2 * tokens * DOWN + (2 * tokens * UP if up_input_grad else 0)
    return forward + weight_grads + input_grads


# layout -> (model FLOPs, recompute FLOPs) of every step on every rank
EXPECTED: dict[str, tuple[int, int]] = {
    "tp": (_mlp_step(TOKENS) // TP, 0),
    # SP: the LayerNorm before `up` has weights, so `up` also computes its input gradient.
    "tp_sp": (_mlp_step(TOKENS, up_input_grad=True) // TP, 0),
    # The whole checkpointed MLP is recomputed once in backward: one more forward, apart.
    "tp_recompute": (_mlp_step(TOKENS) // TP, 2 * TOKENS * (UP + DOWN) // TP),
    "fsdp": (_mlp_step(TOKENS), 0),
    "fsdp_tp": (_mlp_step(TOKENS) // TP, 0),
}


def _pipeline_stage_flops(rank: int) -> int:
    # Mesh ("pp", "dp") = (2, 2): ranks 0 and 1 hold stage 0 (`up`), ranks 2 and 3 stage 1
    # (`down`). Stage 0's input is raw data (no input gradient); stage 1's comes from stage 0.
    # All micro-batches together are the dp rank's batch.
    if rank < 2:
        return 2 * TOKENS * UP * 2
    return 2 * TOKENS * DOWN * 3


@dataclass(frozen=True)
class Run:
    """What the job produced: layout -> rank -> [(step, model_flops, recompute_flops)] from the
    JSONL files, in step order, and the collector's metrics text."""

    reports: dict[str, dict[int, list[tuple[int, float, float]]]]
    metrics: list[str]

    def collector_counter(self, name: str, layout: str) -> float:
        prefix = f'{name}{{job="flops-{layout}"}} '
        [value] = [line[len(prefix) :] for line in self.metrics if line.startswith(prefix)]
        return float(value)


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Run:
    out = tmp_path_factory.mktemp("sharded_flops")
    collector = CollectorProcess(out)
    try:
        args = (str(out), "--collector-url", collector.url)
        command, env = job_command(JOB, *args, temp=out, ranks=4)
        result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
        assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
        with urllib.request.urlopen(collector.url + "/metrics", timeout=30) as response:
            metrics = response.read().decode().splitlines()
    finally:
        collector.stop()
    found: dict[str, dict[int, list[tuple[int, float, float]]]] = {}
    for path in sorted(out.glob("*.jsonl")):
        layout, rank = path.stem.rsplit("-", 1)
        rows = [
            (r["step"], r["model_flops"], r["recompute_flops"])
            for line in path.read_text().splitlines()
            for r in json.loads(line)["reports"]
        ]
        found.setdefault(layout, {})[int(rank)] = sorted(rows)
    return Run(found, metrics)


@pytest.mark.parametrize("layout", sorted(EXPECTED))
def test_each_rank_counts_its_own_share(run: Run, layout: str) -> None:
    model, recompute = EXPECTED[layout]
    assert sorted(run.reports[layout]) == [0, 1, 2, 3]
    for rank, rows in run.reports[layout].items():
        assert [step for step, _, _ in rows] == list(range(job.STEPS)), rank
        for step, model_flops, recompute_flops in rows:
            assert model_flops == pytest.approx(model, rel=0.02), (rank, step)
            assert recompute_flops == pytest.approx(recompute, rel=0.02), (rank, step)
    # The collector got the same reports: 4 ranks x STEPS steps of them.
    total = run.collector_counter("mfuscope_model_flops_total", layout)
    assert total == pytest.approx(4 * job.STEPS * model, rel=0.02)
    hardware = run.collector_counter("mfuscope_hardware_flops_total", layout)
    assert hardware == pytest.approx(4 * job.STEPS * (model + recompute), rel=0.02)


def test_tensor_parallel_share_is_the_whole_model_divided_by_tp(
    run: Run,
) -> None:
    # The same data on the same model: TP ranks report half of what an FSDP rank reports.
    for rank in range(4):
        whole = run.reports["fsdp"][rank][0][1]
        assert run.reports["tp"][rank][0][1] == pytest.approx(whole / TP, rel=0.02)
        assert run.reports["fsdp_tp"][rank][0][1] == pytest.approx(whole / TP, rel=0.02)


@pytest.mark.parametrize("layout", ["pp", "pp_1f1b"])
def test_a_pipeline_rank_counts_only_its_stage(run: Run, layout: str) -> None:
    # Also on the first step, whose schedule runs the stages' one-time metadata inference.
    for rank, rows in run.reports[layout].items():
        assert [step for step, _, _ in rows] == list(range(job.STEPS))
        for step, model_flops, recompute_flops in rows:
            assert model_flops == pytest.approx(_pipeline_stage_flops(rank), rel=0.02), step
            assert recompute_flops == 0
    total = run.collector_counter("mfuscope_model_flops_total", layout)
    expected = job.STEPS * sum(_pipeline_stage_flops(rank) for rank in range(4))
    assert total == pytest.approx(expected, rel=0.02)


def test_every_step_of_a_changing_batch_carries_its_own_flops(
    run: Run,
) -> None:
    for rank, rows in run.reports["varying"].items():
        assert [step for step, _, _ in rows] == list(range(len(job.VARYING_BATCHES)))
        for (step, model_flops, _), batch in zip(rows, job.VARYING_BATCHES, strict=True):
            assert model_flops == pytest.approx(_mlp_step(batch * job.SEQ), rel=0.02), (
                rank,
                step,
                batch,
            )
    total = run.collector_counter("mfuscope_model_flops_total", "varying")
    expected = 4 * sum(_mlp_step(batch * job.SEQ) for batch in job.VARYING_BATCHES)
    assert total == pytest.approx(expected, rel=0.02)
