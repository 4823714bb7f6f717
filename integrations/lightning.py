"""mfuscope for Lightning: ``lightning.Trainer(callbacks=[MfuscopeCallback()])``.

One mfuscope step per optimizer step: a step opens at the first ``on_train_batch_start`` of a
gradient-accumulation cycle and closes at the ``on_train_batch_end`` after which
``trainer.global_step`` (Lightning's count of optimizer steps) has moved, so with
``accumulate_grad_batches=k`` one step spans k micro-batches and its counted FLOPs cover all of
them. The Agent is created at ``on_train_start``, which runs on every rank once the strategy
(DDP, FSDP, ...) has set up the process group and wrapped the module, and closed at
``on_train_end`` (or on an exception). Importing this module imports ``lightning``.

Validation, checkpoint saves and the checkpoint load are phases of the job-time ledger
(docs/definitions.md#job-time-ledger), with no user code: ``evaluation`` from
``on_validation_start`` to ``on_validation_end``; ``checkpoint_save`` around the trainer's
``save_checkpoint`` (which ``ModelCheckpoint`` and users call), wrapped on the trainer object at
train start; ``checkpoint_load`` around the strategy's ``load_checkpoint`` (the file read of
``fit(ckpt_path=...)``), timed from ``setup`` on, before the Agent exists, and handed to it once
created (the load comes before the first step).
"""

from __future__ import annotations

import functools
import time
from typing import Any

from mfuscope.integrations._driver import AgentDriver, framework_missing

try:
    from lightning.pytorch.callbacks import Callback
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise framework_missing("lightning", "lightning") from exc

__all__ = ["MfuscopeCallback"]


class MfuscopeCallback(Callback):  # type: ignore[misc]
    """Live MFU for a Lightning job; ``agent_options`` are `Agent(...)` keywords.

    ``job`` defaults to the logger's name (else the LightningModule's class name) when neither
    ``job=`` nor MFUSCOPE_JOB is set. FLOPs are counted by the agent on the first step unless
    ``flops_per_step`` is given.
    """

    def __init__(self, **agent_options: Any) -> None:
        self._driver = AgentDriver(agent_options)
        self._optimizer_steps_at_begin = 0
        self._loads: list[tuple[int, int]] = []  # checkpoint loads before the Agent existed

    @property
    def agent(self) -> Any:
        """The rank's `mfuscope.agent.Agent` between train start and train end, else None."""
        return self._driver.agent

    def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
        strategy = getattr(trainer, "strategy", None)
        load = None if strategy is None else getattr(strategy, "load_checkpoint", None)
        if strategy is None or load is None or getattr(load, "_mfuscope_timed", False):
            return
        loads = self._loads

        @functools.wraps(load)
        def load_checkpoint(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter_ns()
            try:
                return load(*args, **kwargs)
            finally:
                loads.append((start, time.perf_counter_ns()))

        load_checkpoint._mfuscope_timed = True  # type: ignore[attr-defined]
        strategy.load_checkpoint = load_checkpoint

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        logger = getattr(trainer, "logger", None)
        default_job = getattr(logger, "name", None) or type(pl_module).__name__
        driver = self._driver
        driver.start(model=pl_module, default_job=default_job)
        if driver.agent is not None:
            for start, end in self._loads:
                driver.agent.phase("checkpoint_load").record(start, end)
        self._loads.clear()
        save = getattr(trainer, "save_checkpoint", None)
        if save is None:
            return

        @functools.wraps(save)
        def save_checkpoint(*args: Any, **kwargs: Any) -> Any:
            with driver.phase("checkpoint_save"):
                return save(*args, **kwargs)

        trainer.save_checkpoint = save_checkpoint

    def on_validation_start(self, trainer: Any, pl_module: Any) -> None:
        self._driver.begin_phase("evaluation")

    def on_validation_end(self, trainer: Any, pl_module: Any) -> None:
        self._driver.end_phase()

    def on_train_batch_start(
        self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int
    ) -> None:
        if not self._driver.in_step:
            self._optimizer_steps_at_begin = trainer.global_step
            self._driver.begin_step()

    def on_train_batch_end(
        self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if trainer.global_step != self._optimizer_steps_at_begin:
            self._driver.end_step()

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        self._driver.close()
        vars(trainer).pop("save_checkpoint", None)  # the class's own again

    def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
        self._driver.close()
