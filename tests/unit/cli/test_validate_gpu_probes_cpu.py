"""The validate-gpu probes that can run without a GPU, run on CPU with a tiny model: the training
loop under the real agent (its reports read back through the wire schema) and a profiled window
decomposed by the real engine. On CPU there is no device timeline and no host sync to catch, so
this checks the probes' plumbing and the FLOP bookkeeping, not the GPU measurements."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from mfuscope.cli.validate_gpu import _probes

pytestmark = pytest.mark.slow

TINY = _probes.ModelSize(layers=2, width=64, seq=32, batch=2, vocab=64)


@pytest.fixture(scope="module")
def setup() -> _probes.TrainingSetup:
    return _probes.TrainingSetup(TINY, device="cpu")


def test_training_probe_counts_the_analytical_flops(
    setup: _probes.TrainingSetup, tmp_path: Path
) -> None:
    probe = _probes.training(setup, tmp_path, rounds=2, block=2)
    assert probe.steps == 5 + 10 + 2 * 2
    # FlopCounterMode (with the agent's CPU attention mapping, the attention backward's score
    # recompute booked as recompute) against the megatron count: the probe's formula, exactly.
    assert probe.counted_model_flops == probe.analytical_model_flops
    assert probe.mfu is not None and probe.hfu is not None and 0 < probe.mfu <= probe.hfu
    assert probe.sync_error is None and probe.agent_internal_errors == 0
    assert probe.event_step_s > 0 and probe.wall_step_s > 0 and probe.overhead_ratio > 0


def test_window_probe_buckets_sum_to_the_step(setup: _probes.TrainingSetup, tmp_path: Path) -> None:
    window = _probes.profiled_window(setup, tmp_path)
    assert window.buckets["compute"] > 0
    assert math.isclose(sum(window.buckets.values()), window.wall_s, rel_tol=1e-9)
    assert window.kernels == 0  # a CPU trace has no device kernels
