"""A real 4-rank gloo job on a 2 x 2 (dp, tp) layout, built three ways in turn, through the real
agent to a real collector: every collective lands on its own group's axis with n = 2, never on
``unknown`` or the world size.

Hand derivation (`tests/support/mesh_job.py`: WIDTH 32, HIDDEN 64, BATCH 8, fp32; the collective
counters count every collective of the 5 steps on each of the 4 ranks (the agents' always-on
flight-recorder records), so every per-rank-step amount counts 20 times; the profiled window,
steps 1-2, still carries its own collectives on its step reports; every group has n = 2 ranks):
- dp, `mesh` and `megatron`: each rank all-reduces its local gradient shards over its dp group:
  up (HIDDEN/2 x WIDTH) and down (WIDTH x HIDDEN/2), 32 x 32 x 4 B = 4096 B each, 8192 B per
  rank-step -> 163,840 B;
- dp, `fsdp_tp` (FSDP2 over dp around the TP model): one all_gather of the root's parameters per
  step (FSDP2 keeps the root unsharded from forward to backward), S = the gathered tp-local
  parameters, 8192 B -> 163,840 B; the gradient reduce-scatter, which gloo runs as an all_reduce
  of the whole 8192 B gradient -> 163,840 B;
- tp: the row-parallel output (BATCH x WIDTH) = 8 x 32 x 4 B = 1024 B is all-reduced in forward;
  the DTensor jobs' input needs no gradient (no backward all_reduce): 1024 B per rank-step ->
  20,480 B. The Megatron-style job's differentiable all_reduce also all-reduces its gradient in
  backward: 2048 B per rank-step -> 40,960 B;
- bus bytes / bytes with n = 2: all_reduce 2(n-1)/n = 1 (it would read 1.5 with the world size
  n = 4), all_gather (n-1)/n = 1/2.

Model FLOPs (counted by the agent: matmuls, 2 x m x k x n each): the whole model on one dp
replica's batch of 8 is forward 2 x (2 x 8 x 32 x 64) = 65,536, backward 98,304 (`down`: weight
and input gradients, `up`: the weight gradient only, its input needs none), 163,840 per step; each
tp rank does half of it, 81,920, in every layout. 4 ranks x 5 steps -> 1,638,400 at the collector
(the whole model's count on every rank, as FLOP counters see DTensors, would give twice that).
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
RANK_STEPS = 4 * 5  # 4 ranks x every step (always-on records; profiled windows add no calls)
WHOLE_MODEL_FLOPS = 2 * (2 * 8 * 32 * 64) + 3 * (2 * 8 * 32 * 64)  # forward + backward, per step
TP = 2
GRADS = RANK_STEPS * 2 * 32 * 32 * 4  # both tp-local weight shards, every rank-step
OUTPUT = RANK_STEPS * 8 * 32 * 4  # the row-parallel output, every rank-step
# (op, axis) -> collective bytes S summed at the collector.
EXPECTED = {
    "mesh": {("all_reduce", "dp"): GRADS, ("all_reduce", "tp"): OUTPUT},
    "megatron": {("all_reduce", "dp"): GRADS, ("all_reduce", "tp"): 2 * OUTPUT},
    "fsdp_tp": {
        ("all_gather", "dp"): GRADS,
        ("all_reduce", "dp"): GRADS,
        ("all_reduce", "tp"): OUTPUT,
    },
}
BUS_FACTOR_N2 = {"all_reduce": 2 * (2 - 1) / 2, "all_gather": (2 - 1) / 2}
_SAMPLE = re.compile(r"^(\w+)\{([^}]*)\} (\S+)$")


@pytest.fixture
def collector(tmp_path: Path) -> Iterator[CollectorProcess]:
    process = CollectorProcess(tmp_path)
    yield process
    process.stop()


def run_layout(layout: str, collector: CollectorProcess, out: Path) -> None:
    args = ("--layout", layout, "--collector-url", collector.url, "--out", str(out))
    command, env = job_command(SUPPORT / "mesh_job.py", *args, temp=out / "tmp", ranks=4)
    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-6000:]


def metrics(collector: CollectorProcess, name: str) -> dict[frozenset[tuple[str, str]], float]:
    """Samples of one metric family: labels -> value."""
    with urllib.request.urlopen(collector.url + "/metrics", timeout=30) as response:
        lines = response.read().decode().splitlines()
    samples = {}
    for line in lines:
        match = _SAMPLE.match(line)
        if match and match.group(1) == name:
            labels = frozenset(re.findall(r'(\w+)="([^"]*)"', match.group(2)))
            samples[labels] = float(match.group(3))
    return samples


def by_op_axis(samples: dict[frozenset[tuple[str, str]], float], job: str) -> dict[Any, float]:
    return {
        (dict(labels)["op"], dict(labels)["axis"]): value
        for labels, value in samples.items()
        if ("job", job) in labels
    }


def test_every_collective_has_its_groups_axis_and_size(
    collector: CollectorProcess, tmp_path: Path
) -> None:
    # One job runs the three layouts in turn (the ranks and torch start once), each under an
    # agent, a collector job and an output folder of its own.
    run_layout(",".join(EXPECTED), collector, tmp_path)
    for layout in EXPECTED:
        _check_layout(layout, collector, tmp_path / layout)


def _check_layout(layout: str, collector: CollectorProcess, out: Path) -> None:
    job = f"groups-{layout}"
    expected = EXPECTED[layout]

    exposed = {
        dict(labels)["axis"]: value
        for labels, value in metrics(collector, "mfuscope_step_component_seconds_total").items()
        if {("job", job), ("component", "exposed_comm")} <= labels
    }
    assert set(exposed) == {"dp", "tp"}, (layout, exposed)
    assert all(seconds > 0 for seconds in exposed.values())

    sent = by_op_axis(metrics(collector, "mfuscope_collective_bytes_total"), job)
    bus = by_op_axis(metrics(collector, "mfuscope_collective_bus_bytes_total"), job)
    assert sent == expected, layout
    for op, axis in expected:
        assert bus[(op, axis)] / sent[(op, axis)] == pytest.approx(BUS_FACTOR_N2[op])

    # Each rank's model FLOPs are its own share: the whole model's / tp.
    flops = metrics(collector, "mfuscope_model_flops_total")
    job_flops = sum(v for labels, v in flops.items() if ("job", job) in labels)
    assert job_flops == pytest.approx(4 * 5 * WHOLE_MODEL_FLOPS / TP, rel=0.02)

    # What the agents sent: every collective with n = 2, none of unknown group.
    with_n = {(op, axis, 2) for op, axis in expected}
    for rank in range(4):
        lines = (out / f"reports-{rank}.jsonl").read_text().splitlines()
        collectives = {
            (c["op"], c["axis"], c["group_size"])
            for line in lines
            for report in json.loads(line)["reports"]
            for c in report["collectives"]
        }
        assert collectives == with_n, (layout, rank)

    # A kept trace carries the agent's worker-thread map: offline analysis agrees.
    kept = sorted((out / "kept").glob("*.json.gz"))
    assert len(kept) == 4, layout
    for path in kept:
        steps = analyze_trace(read_trace(path)).steps
        offline = {(c.op, c.axis, c.group_size) for s in steps for c in s.collectives}
        assert offline == with_n, path.name
