"""The Lightning callback in one process: a step spans the micro-batches until Lightning's
optimizer-step count (`trainer.global_step`) moves, including a short last cycle."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from mfuscope.core.schema import decode_batch

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("lightning") is None, reason="needs lightning (the dev extra)"
)


def MfuscopeCallback(**options: Any) -> Any:
    """The callback, imported at its first use, not at collection: Lightning takes seconds to
    import, which every worker of every run would pay."""
    from mfuscope.integrations.lightning import MfuscopeCallback as callback

    return callback(**options)


def test_steps_follow_optimizer_steps_with_a_short_last_cycle(tmp_path: Path) -> None:
    path = tmp_path / "r.jsonl"
    callback = MfuscopeCallback(
        jsonl_path=str(path), profile=False, peak_flops=1e11, flops_per_step=7.0
    )
    trainer = SimpleNamespace(global_step=0, logger=None)
    module = SimpleNamespace()
    callback.on_train_start(trainer, module)
    assert callback.agent.config.job == "SimpleNamespace"  # no logger: the module's class name
    # accumulate_grad_batches=2 over 5 micro-batches: optimizer steps after batches 1, 3 and 4.
    for batch_idx, steps_after in enumerate([0, 1, 1, 2, 3]):
        callback.on_train_batch_start(trainer, module, None, batch_idx)
        trainer.global_step = steps_after
        callback.on_train_batch_end(trainer, module, None, None, batch_idx)
    callback.on_train_end(trainer, module)
    reports: list[Any] = [
        r for line in path.read_text().splitlines() for r in decode_batch(line).reports
    ]
    assert [(r.step, r.model_flops) for r in reports] == [(0, 7.0), (1, 7.0), (2, 7.0)]


def test_an_exception_closes_the_agent_and_an_open_step(tmp_path: Path) -> None:
    path = tmp_path / "r.jsonl"
    callback = MfuscopeCallback(
        job="j", jsonl_path=str(path), profile=False, peak_flops=1e11, flops_per_step=7.0
    )
    trainer = SimpleNamespace(global_step=0, logger=SimpleNamespace(name="logged"))
    callback.on_train_start(trainer, None)
    assert callback.agent.config.job == "j"  # the user's option wins over the logger's name
    callback.on_train_batch_start(trainer, None, None, 0)
    callback.on_exception(trainer, None, RuntimeError("boom"))
    assert callback.agent is None
    assert [
        r.step for line in path.read_text().splitlines() for r in decode_batch(line).reports
    ] == [0]


@pytest.mark.parametrize(
    ("options", "env", "job"),
    [
        ({}, {}, "logged"),  # derived: the logger's name
        ({}, {"MFUSCOPE_JOB": "env"}, "env"),
        ({"job": "arg"}, {"MFUSCOPE_JOB": "env"}, "arg"),
    ],
)
def test_user_options_then_environment_then_the_loggers_name(
    options: dict[str, str], env: dict[str, str], job: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("MFUSCOPE_FLOPS_PER_STEP", "9")
    callback = MfuscopeCallback(profile=False, hardware_counters=False, peak_flops=1e11, **options)
    trainer = SimpleNamespace(global_step=0, logger=SimpleNamespace(name="logged"))
    callback.on_train_start(trainer, None)
    agent = callback.agent
    callback.on_train_end(trainer, None)
    assert (agent.config.job, agent.config.flops_per_step) == (job, 9.0)


class StandInTrainer(SimpleNamespace):
    """What the callback reads of a Lightning ``Trainer``: its strategy's checkpoint load (the
    file read of ``fit(ckpt_path=...)``) and its ``save_checkpoint``."""

    def save_checkpoint(self, filepath: str, weights_only: bool = False) -> str:
        return filepath


def test_validation_checkpoint_saves_and_the_load_are_phases(tmp_path: Path) -> None:
    path = tmp_path / "r.jsonl"
    callback = MfuscopeCallback(
        job="j", jsonl_path=str(path), profile=False, peak_flops=1e11, flops_per_step=7.0
    )
    strategy = SimpleNamespace(load_checkpoint=lambda path, weights_only=None: {"step": 3})
    trainer = StandInTrainer(global_step=0, logger=None, strategy=strategy)
    callback.setup(trainer, None, "fit")
    assert trainer.strategy.load_checkpoint("ckpt") == {"step": 3}  # before the Agent exists
    callback.on_train_start(trainer, None)
    for batch_idx in range(2):
        callback.on_train_batch_start(trainer, None, None, batch_idx)
        trainer.global_step += 1
        callback.on_train_batch_end(trainer, None, None, None, batch_idx)
        callback.on_validation_start(trainer, None)
        callback.on_validation_end(trainer, None)
        assert trainer.save_checkpoint("last.ckpt") == "last.ckpt"
    callback.on_train_end(trainer, None)
    assert "save_checkpoint" not in vars(trainer)  # unwrapped at the end
    ledger = decode_batch(path.read_text().splitlines()[-1]).ledger
    assert ledger is not None
    assert ledger.checkpoint_load_ns > 0
    assert ledger.evaluation_ns > 0 and ledger.checkpoint_save_ns > 0
