"""The framework integrations in real 2-rank gloo jobs feeding a real collector process.

Each framework's job trains with gradient accumulation 1 and 2 over the same data, so the second
run has half the optimizer steps and twice the FLOPs per step. Each rank's counted model FLOPs per
step are checked against the analytical count derived here from the model's shape (matmul FLOPs,
2 per multiply-add; training = forward + a backward of twice the forward). The same job then
trains once more with evaluations and checkpoint saves configured on the framework's Trainer
only, which must show as phases of the job-time ledger. One job per framework (the Trainer under
`accelerate launch`, Lightning under `torchrun`): the start-up (torch and the framework imported
on every rank) is most of a job's cost.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from mfuscope.core.schema import decode_batch

from tests.support.collector_process import CollectorProcess
from tests.support.framework_jobs import JobShape
from tests.support.launch import job_env

pytestmark = pytest.mark.slow

SUPPORT = Path(__file__).resolve().parents[1] / "support"
SHAPE = JobShape(layers=2, width=64, heads=4, vocab=256, seq_len=32, batch=4, micro_batches=6)
# Counting is exact arithmetic on shapes: the only slack is float rounding of the sums.
RELATIVE_TOLERANCE = 1e-9


def gpt2_flops_per_token(shape: JobShape) -> float:
    """GPT-2 with eager attention, counted per token of one training step.

    Forward, per layer: the qkv projection 2*d*3d, the attention output projection 2*d*d and the
    MLP 2*d*4d + 2*4d*d, i.e. 24 d^2; the scores Q K^T and the weighted sum A V over the full
    T x T matrix (no causal discount), 2*T*d each; the tied output head 2*d*V once. Training is
    three times the forward (the backward computes input and weight gradients: 2x).
    """
    d, t = shape.width, shape.seq_len
    forward = shape.layers * (24 * d * d + 4 * t * d) + 2 * d * shape.vocab
    return 3.0 * forward


def mlp_flops_per_token(shape: JobShape) -> float:
    """The Lightning job's MLP model: per layer d->4d and 4d->d (2*8 d^2 forward), the head
    2*d*V; training is three times the forward (6 x matmul parameters)."""
    d = shape.width
    return 3.0 * (shape.layers * 16 * d * d + 2 * d * shape.vocab)


@pytest.fixture
def collector(tmp_path: Path) -> Iterator[CollectorProcess]:
    process = CollectorProcess(tmp_path)
    yield process
    process.stop()


TORCHRUN = [str(Path(sys.executable).parent / "torchrun"), "--standalone", "--nproc_per_node=2"]
# accelerate's multi-process launcher (torch.distributed.run underneath); the job itself asks
# for the CPU (use_cpu=True) and gloo.
ACCELERATE = [str(Path(sys.executable).parent / "accelerate"), "launch", "--multi_gpu"]
ACCELERATE += ["--num_processes=2", "--num_machines=1", "--mixed_precision=no"]
ACCELERATE += ["--dynamo_backend=no"]


def run_job(
    script: str, collector: CollectorProcess, out: Path, *runs: str, launcher: list[str] = TORCHRUN
) -> None:
    env = job_env(out / "tmp")
    command = [*launcher, str(SUPPORT / script)]
    command += ["--collector-url", collector.url, "--out", str(out), "--runs", *runs]
    result = subprocess.run(
        [*command, *SHAPE.args()], env=env, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-6000:]


def rank_flops(out: Path, job: str, rank: int) -> dict[int, float]:
    """Step -> model FLOPs of one rank, from its JSONL sink."""
    steps = {}
    for line in (out / f"{job}-{rank}.jsonl").read_text().splitlines():
        batch = json.loads(line)
        assert batch["job"] == job and batch["rank"] == rank and batch["world_size"] == 2
        for report in batch["reports"]:
            steps[report["step"]] = report["model_flops"]
    return steps


def collector_counter(collector: CollectorProcess, name: str, job: str) -> float:
    with urllib.request.urlopen(collector.url + "/metrics", timeout=30) as response:
        lines = response.read().decode().splitlines()
    prefix = f'{name}{{job="{job}"}} '
    [value] = [line[len(prefix) :] for line in lines if line.startswith(prefix)]
    return float(value)


def check_runs(
    collector: CollectorProcess, out: Path, jobs: dict[int, str], flops_per_token: float
) -> None:
    """Per rank: one report per optimizer step, each with the analytical FLOPs; the collector
    holds the same steps and FLOPs; accumulation k divides the steps and multiplies the FLOPs
    (when both k = 1 and k = 2 ran)."""
    per_step = {}
    for grad_accum, job in jobs.items():
        steps = SHAPE.micro_batches // grad_accum
        expected = flops_per_token * SHAPE.tokens_per_micro_batch * grad_accum
        for rank in (0, 1):
            flops = rank_flops(out, job, rank)
            assert sorted(flops) == list(range(steps)), (job, rank)
            for step, value in flops.items():
                assert value == pytest.approx(expected, rel=RELATIVE_TOLERANCE), (job, rank, step)
        assert collector_counter(collector, "mfuscope_steps_total", job) == 2 * steps
        total = collector_counter(collector, "mfuscope_model_flops_total", job)
        assert total == pytest.approx(2 * steps * expected, rel=RELATIVE_TOLERANCE)
        per_step[grad_accum] = (steps, expected)
    if len(per_step) == 2:
        assert per_step[2][0] * 2 == per_step[1][0]
        assert per_step[2][1] == 2 * per_step[1][1]


def rank_ledgers(out: Path, job: str) -> list[Any]:
    """Each rank's job-time totals from its agent's last batch (its JSONL sink)."""
    ledgers = []
    for rank in (0, 1):
        last = (out / f"{job}-{rank}.jsonl").read_text().splitlines()[-1]
        ledgers.append(decode_batch(last).ledger)
    return ledgers


def collector_time(collector: CollectorProcess, job: str) -> dict[str, float]:
    with urllib.request.urlopen(collector.url + "/metrics", timeout=30) as response:
        text = response.read().decode()
    pattern = rf'^mfuscope_job_rank_seconds_total{{category="(\w+)",job="{job}"}} (\S+)$'
    return {c: float(v) for c, v in re.findall(pattern, text, re.M)}


def test_huggingface_trainer_two_ranks_under_accelerate_launch_counts_and_phases(
    collector: CollectorProcess, tmp_path: Path
) -> None:
    """Three Trainer runs in one job under `accelerate launch`: accumulation 1 and 2 (steps and
    FLOPs), then evaluation and checkpoint saves every 2 steps, configured on the Trainer only:
    the callback marks both (no user code), on every rank and in the collector's ledger, and
    they add no step and no FLOPs to the steps. accelerate's launcher is torch.distributed.run
    (torchrun) with accelerate's settings on top; the callback reads neither, and the plain
    torchrun launch is the Lightning job's below (one job: start-up is most of its cost)."""
    run_job("hf_job.py", collector, tmp_path, "1", "2", "1:phases", launcher=ACCELERATE)
    flops = gpt2_flops_per_token(SHAPE)
    check_runs(collector, tmp_path, {1: "hf-ga1", 2: "hf-ga2"}, flops)
    check_runs(collector, tmp_path, {1: "hf-ga1-phases"}, flops)
    for ledger in rank_ledgers(tmp_path, "hf-ga1-phases"):
        assert ledger is not None
        assert ledger.evaluation_ns > 0 and ledger.checkpoint_save_ns > 0
    time = collector_time(collector, "hf-ga1-phases")
    assert time["evaluation"] > 0 and time["checkpoint_save"] > 0 and time["step"] > 0
    assert any((tmp_path / "hf-ga1-phases").glob("checkpoint-*"))  # the Trainer did save


def test_lightning_ddp_two_ranks_counts_and_phases(
    collector: CollectorProcess, tmp_path: Path
) -> None:
    """Four fits in one torchrun job: accumulation 1 and 2 (steps and FLOPs), then one with
    validation and ModelCheckpoint saves every 2 steps, then one from its last checkpoint: the
    callback marks validation, saves and the load (no user code), and they add no step and no
    FLOPs to the steps."""
    run_job("lightning_job.py", collector, tmp_path, "ddp:1", "ddp:2", "ddp:1:phases")
    flops = mlp_flops_per_token(SHAPE)
    check_runs(collector, tmp_path, {1: "lightning-ddp-ga1", 2: "lightning-ddp-ga2"}, flops)
    check_runs(collector, tmp_path, {1: "lightning-ddp-ga1-phases"}, flops)
    for ledger in rank_ledgers(tmp_path, "lightning-ddp-ga1-phases"):
        assert ledger is not None
        assert ledger.evaluation_ns > 0 and ledger.checkpoint_save_ns > 0
    for ledger in rank_ledgers(tmp_path, "lightning-ddp-ga1-phases-resumed"):
        assert ledger is not None and ledger.checkpoint_load_ns > 0
    time = collector_time(collector, "lightning-ddp-ga1-phases-resumed")
    assert time["checkpoint_load"] > 0 and time["evaluation"] > 0 and time["step"] > 0
