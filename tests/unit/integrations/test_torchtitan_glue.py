"""The torchtitan glue in one process: FLOPs per step from torchtitan's per-token count, one
mfuscope step per ``train_step``, the Agent closed when ``train()`` ends.

torchtitan's ``Trainer`` cannot be imported on a CPU-only machine (its import chain needs
triton), so the trainer here is a stand-in with the attributes the glue reads; where torchtitan
is installed, its real ``ParallelDims`` supplies ``non_data_parallel_size``.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from mfuscope.core.schema import decode_batch
from mfuscope.integrations import torchtitan as glue

AGENT = {"profile": False, "calibrate_cpu_peak": False, "peak_flops": 1e11}


def parallel_dims(tp: int) -> Any:
    try:
        from torchtitan.distributed.parallel_dims import ParallelDims
    except ImportError:
        return SimpleNamespace(non_data_parallel_size=tp)
    return ParallelDims(dp_replicate=1, dp_shard=2, cp=1, tp=tp, pp=1, ep=1, world_size=2 * tp)


class StandInTrainer:
    """What ``torchtitan.trainer.Trainer`` exposes to the glue after it is built."""

    def __init__(self, per_token: int, tp: int = 1, steps: int = 3) -> None:
        self.metrics_processor = SimpleNamespace(num_flops_per_token=per_token)
        training = SimpleNamespace(local_batch_size=2, seq_len=8, steps=steps)
        self.config = SimpleNamespace(training=training)
        self.gradient_accumulation_steps = 3
        self.parallel_dims = parallel_dims(tp)
        self.step = 0
        self.calls: list[object] = []

    def train_step(self, data_iterator: object) -> str:
        self.calls.append(data_iterator)
        return "stepped"

    def train(self) -> None:
        while self.step < self.config.training.steps:
            self.step += 1
            self.train_step(self.step)


def reports(path: Path) -> list[Any]:
    return [r for line in path.read_text().splitlines() for r in decode_batch(line).reports]


@pytest.mark.parametrize(("tp", "expected"), [(1, 1000 * 2 * 8 * 3), (2, 1000 * 2 * 8 * 3 / 2)])
def test_flops_per_step_is_torchtitans_count_for_this_ranks_tokens(
    tp: int, expected: float
) -> None:
    assert glue.flops_per_step(StandInTrainer(1000, tp=tp)) == expected


def test_flops_per_step_refuses_an_unbuilt_trainer() -> None:
    with pytest.raises(ValueError, match="num_flops_per_token"):
        glue.flops_per_step(StandInTrainer(-1))


def test_instrument_makes_each_train_step_one_mfuscope_step(tmp_path: Path) -> None:
    trainer = StandInTrainer(1000)
    agent = glue.instrument(trainer, job="titan", jsonl_path=str(tmp_path / "r.jsonl"), **AGENT)
    assert [trainer.train_step(i) for i in range(4)] == ["stepped"] * 4
    agent.close()
    assert trainer.calls == [0, 1, 2, 3]
    got = reports(tmp_path / "r.jsonl")
    assert [r.step for r in got] == [0, 1, 2, 3]
    assert {r.model_flops for r in got} == {1000 * 2 * 8 * 3}


def test_train_is_instrumented_on_entry_and_closed_on_exit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MFUSCOPE_JSONL_PATH", str(tmp_path / "env.jsonl"))
    monkeypatch.setenv("MFUSCOPE_PROFILE", "0")
    monkeypatch.setenv("MFUSCOPE_CALIBRATE_CPU_PEAK", "0")
    monkeypatch.setenv("MFUSCOPE_FLUSH_INTERVAL_S", "60")
    train = glue._instrumented_train(StandInTrainer.train)
    trainer = StandInTrainer(500, steps=2)
    train(trainer)
    got = reports(tmp_path / "env.jsonl")  # written by close(): the agent was closed
    assert [(r.step, r.model_flops) for r in got] == [(0, 500 * 48.0), (1, 500 * 48.0)]


@pytest.mark.parametrize(
    ("options", "env", "flops", "job"),
    [
        ({}, {}, 1000 * 48.0, "torchtitan"),  # derived: torchtitan's count, the glue's name
        ({}, {"MFUSCOPE_FLOPS_PER_STEP": "123", "MFUSCOPE_JOB": "env"}, 123.0, "env"),
        (
            {"flops_per_step": 7.0, "job": "arg"},
            {"MFUSCOPE_FLOPS_PER_STEP": "123", "MFUSCOPE_JOB": "env"},
            7.0,
            "arg",
        ),
    ],
)
def test_user_options_then_environment_then_derived_values(
    options: dict[str, Any],
    env: dict[str, str],
    flops: float,
    job: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    agent = glue.instrument(StandInTrainer(1000), hardware_counters=False, **AGENT, **options)
    agent.close()
    assert (agent.config.flops_per_step, agent.config.job) == (flops, job)


class StandInCheckpointer:
    """torchtitan's ``CheckpointManager`` as the glue sees it: ``save`` after every step saves
    only when ``_should_save`` says so; ``load`` before the first step."""

    def __init__(self, interval: int) -> None:
        self.interval = interval
        self.saved: list[int] = []

    def _should_save(self, curr_step: int, last_step: bool = False) -> bool:
        return last_step or curr_step % self.interval == 0

    def save(self, curr_step: int, last_step: bool = False) -> None:
        if self._should_save(curr_step, last_step):
            self.saved.append(curr_step)

    def load(self, step: int = -1) -> bool:
        return True


@pytest.mark.parametrize(("interval", "saves"), [(3, [3]), (10, [])])
def test_the_checkpoint_managers_saves_and_load_are_phases(
    tmp_path: Path, interval: int, saves: list[int]
) -> None:
    trainer = StandInTrainer(1000)
    trainer.checkpointer = StandInCheckpointer(interval)  # type: ignore[attr-defined]
    path = tmp_path / "r.jsonl"
    agent = glue.instrument(trainer, job="titan", jsonl_path=str(path), **AGENT)
    assert trainer.checkpointer.load(step=-1) is True  # type: ignore[attr-defined]
    for step in range(1, 5):
        trainer.train_step(step)
        trainer.checkpointer.save(step)  # type: ignore[attr-defined]
    agent.close()
    assert trainer.checkpointer.saved == saves  # type: ignore[attr-defined]
    ledger = decode_batch(path.read_text().splitlines()[-1]).ledger
    assert ledger is not None and ledger.checkpoint_load_ns > 0
    # a save call that does not save is no phase
    assert (ledger.checkpoint_save_ns > 0) == bool(saves)
