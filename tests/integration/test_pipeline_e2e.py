"""Real `torch.distributed.pipelining` runs (GPipe and 1F1B) on 4 gloo ranks, pp = 2 x dp = 2,
through the real agent to a real collector: per-rank FLOPs are the stage's own, pipeline waits
are `bubble_pipeline` with every send/recv on the `pp` axis, and the buckets sum to the step.

Hand derivation (`tests/support/pipeline_job.py`: WIDTH w = 64, stage = Linear(w, 4w), ReLU,
Linear(4w, w), m = 4 micro-batches of b = 4 rows per step, p = 2 stages, fp32; the agent counts
FLOPs on its step 0 and profiles steps 2 and 3 on each of the 4 ranks):

- FLOPs (FlopCounterMode counts matmuls, 2 per multiply-add). Each Linear's forward on the
  step's B = m b = 16 rows is F = 2 B w (4w) = 524,288. Stage 1 (ranks 1, 3): forward 2F,
  backward 4F (input and weight gradients of both Linears: its input comes from stage 0 and
  needs a gradient) -> 6F = 3,145,728. Stage 0 (ranks 0, 2): forward 2F, backward 3F (the first
  Linear's input is the data: no input gradient) -> 5F = 2,621,440. The whole model's would be
  11F on every rank.
- Point-to-point: per micro-batch one activation (b x w fp32 = 1024 B) forward and one gradient
  (1024 B) backward, so each rank sends m = 4 and receives m = 4 messages of 1024 B per step;
  over the profiled window, per op: 4 ranks x 2 steps x 4 x 1024 B = 32,768 B. send/recv bus
  factor 1 (nccl-tests): bus bytes = bytes.
- dp: per step each rank all-reduces its stage's 33,088 gradients (w 4w + 4w + 4w w + w), 132,352 B,
  over its dp group of n = 2: bus factor 2(n-1)/n = 1. The agents' always-on flight-recorder
  records count it on every step; gloo's recorder has no send/recv, so those still count from the
  profiled window.
- Pipeline bubble: structurally positive on every stage. Stage 1 can start a micro-batch only
  when stage 0 has sent it; stage 0, after its forwards (GPipe) or warm-up forwards (1F1B), waits
  for the first gradient, which stage 1 sends only after its own forward and backward of it. The
  ideal GPipe bubble fraction (p-1)/(m+p-1) = 1/5 assumes equal stage times and no other load; on
  this shared 2-core machine (4 ranks, their gloo threads, other jobs) a rank waiting for CPU
  also makes its peer wait, so the measured fraction is not bounded by it in either direction.
  The test checks the sign and the axis.
"""

from __future__ import annotations

import json
import re
import subprocess
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from mfuscope.core.trace import analyze_trace, read_trace

from tests.support.collector_process import CollectorProcess
from tests.support.launch import job_command

pytestmark = pytest.mark.slow

SUPPORT = Path(__file__).resolve().parents[1] / "support"
SCHEDULES = ("gpipe", "1f1b")
STEPS, PROFILED = 6, (2, 3)
MICRO_BATCHES, MICRO_BATCH, WIDTH = 4, 4, 64
LINEAR_FLOPS = 2 * MICRO_BATCHES * MICRO_BATCH * WIDTH * 4 * WIDTH  # F above: 524,288
STAGE_FLOPS = {0: 5 * LINEAR_FLOPS, 1: 6 * LINEAR_FLOPS}
MESSAGE_BYTES = MICRO_BATCH * WIDTH * 4
P2P_WINDOW_BYTES = 4 * len(PROFILED) * MICRO_BATCHES * MESSAGE_BYTES
DP_GRADIENT_BYTES = (WIDTH * 4 * WIDTH + 4 * WIDTH + 4 * WIDTH * WIDTH + WIDTH) * 4
_SAMPLE = re.compile(r"^(\w+\{[^}]*\}) (\S+)$")


def stage_of(rank: int) -> int:
    """init_device_mesh((2, 2), ("dp", "pp")): rank = 2 dp + pp."""
    return rank % 2


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, dict[str, float]]]:
    """Both schedules, one after the other in one 4-rank launch; the collector's samples."""
    out = tmp_path_factory.mktemp("pipeline")
    collector = CollectorProcess(out)
    try:
        command, env = job_command(
            SUPPORT / "pipeline_job.py",
            *("--schedules", *SCHEDULES, "--collector-url", collector.url, "--out", str(out)),
            temp=out / "tmp",
            ranks=4,
        )
        result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
        assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-6000:]
        with urllib.request.urlopen(collector.url + "/metrics", timeout=30) as response:
            lines = response.read().decode().splitlines()
        samples = {m.group(1): float(m.group(2)) for m in map(_SAMPLE.match, lines) if m}
        yield out, samples
    finally:
        collector.stop()


def reports(out: Path, schedule: str, rank: int) -> dict[int, dict[str, Any]]:
    """Step -> the last report of that step in one rank's JSONL sink."""
    steps = {}
    for line in (out / f"pipe-{schedule}-{rank}.jsonl").read_text().splitlines():
        batch = json.loads(line)
        assert (batch["rank"], batch["world_size"]) == (rank, 4)
        for report in batch["reports"]:
            steps[report["step"]] = report
    return steps


def sample(samples: dict[str, float], name: str, **labels: str) -> float:
    """One sample, its labels in the exposition's (sorted) order."""
    text = ",".join(f'{key}="{value}"' for key, value in sorted(labels.items()))
    return samples[f"{name}{{{text}}}"]


@pytest.mark.parametrize("schedule", SCHEDULES)
def test_counted_flops_are_each_stage_s_own(
    schedule: str, run: tuple[Path, dict[str, float]]
) -> None:
    out, samples = run
    for rank in range(4):
        steps = reports(out, schedule, rank)
        assert sorted(steps) == list(range(STEPS)), rank
        expected = STAGE_FLOPS[stage_of(rank)]
        assert {r["model_flops"] for r in steps.values()} == {expected}, rank
    total = sample(samples, "mfuscope_model_flops_total", job=f"pipe-{schedule}")
    assert total == STEPS * 2 * (STAGE_FLOPS[0] + STAGE_FLOPS[1])


@pytest.mark.parametrize("schedule", SCHEDULES)
def test_pipeline_waits_are_pipeline_bubble_with_p2p_on_pp(
    schedule: str, run: tuple[Path, dict[str, float]]
) -> None:
    out, samples = run
    job = f"pipe-{schedule}"
    for rank in range(4):
        profiled = [r for r in reports(out, schedule, rank).values() if r["collectives"]]
        assert [r["step"] for r in profiled] == list(PROFILED), rank
        bubble = 0.0
        for report in profiled:
            assert report["breakdown_step"] == report["step"]
            components = report["components"]
            assert sum(c["seconds"] for c in components) == pytest.approx(report["wall_s"])
            bubble += sum(c["seconds"] for c in components if c["component"] == "bubble_pipeline")
            p2p = {
                (c["op"], c["axis"], c["tier"], c["group_size"], c["bytes"], c["count"])
                for c in report["collectives"]
                if c["op"] in ("send", "recv")
            }
            assert p2p == {
                (op, "pp", "intra_node", 2, MESSAGE_BYTES, MICRO_BATCHES) for op in ("send", "recv")
            }, (rank, report["step"])
        assert bubble > 0, rank
    assert sample(samples, "mfuscope_step_component_seconds_total", **_bucket(job)) > 0
    for op in ("send", "recv"):
        labels = {"axis": "pp", "job": job, "op": op, "tier": "intra_node"}
        assert sample(samples, "mfuscope_collective_bytes_total", **labels) == P2P_WINDOW_BYTES
        assert sample(samples, "mfuscope_collective_bus_bytes_total", **labels) == P2P_WINDOW_BYTES
    # Offline analysis of the kept traces says the same of the point-to-point traffic.
    kept = sorted((out / f"{job}-kept").glob("*.json.gz"))
    assert len(kept) == 4
    for path in kept:
        steps = analyze_trace(read_trace(path)).steps
        assert sum(s.bubble_pipeline_s for s in steps) > 0, path.name
        offline = {(c.op, c.axis, c.group_size) for s in steps for c in s.collectives}
        assert {("send", "pp", 2), ("recv", "pp", 2)} <= offline, path.name


def _bucket(job: str) -> dict[str, str]:
    return {"axis": "pp", "component": "bubble_pipeline", "job": job, "tier": ""}


@pytest.mark.parametrize("schedule", SCHEDULES)
def test_dp_all_reduce_is_on_dp_with_n_2(schedule: str, run: tuple[Path, dict[str, float]]) -> None:
    out, samples = run
    job = f"pipe-{schedule}"
    labels = {"axis": "dp", "job": job, "op": "all_reduce", "tier": "intra_node"}
    sent = sample(samples, "mfuscope_collective_bytes_total", **labels)
    # Every step's all_reduce on every rank (the agents' always-on records), not only profiled ones.
    assert sent == 4 * STEPS * DP_GRADIENT_BYTES
    bus = sample(samples, "mfuscope_collective_bus_bytes_total", **labels)
    assert bus / sent == pytest.approx(2 * (2 - 1) / 2)
    for rank in range(4):
        for report in reports(out, schedule, rank).values():
            exposed = {c["axis"] for c in report["components"] if c["component"] == "exposed_comm"}
            # pp: a p2p's ideal transfer time where the rank has a link model for its tier.
            assert exposed <= {"dp", "pp"}, (rank, report["step"])
