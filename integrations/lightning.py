"""mfuscope for Lightning: ``lightning.Trainer(callbacks=[MfuscopeCallback()])``.

One mfuscope step per optimizer step: a step opens at the first ``on_train_batch_start`` of a
gradient-accumulation cycle and closes at the ``on_train_batch_end`` after which
``trainer.global_step`` (Lightning's count of optimizer steps) has moved, so with
``accumulate_grad_batches=k`` one step spans k micro-batches and its counted FLOPs cover all of
them. The Agent is created at ``on_train_start``, which runs on every rank once the strategy
(DDP, FSDP, ...) has set up the process group and wrapped the module, and closed at
``on_train_end`` (or on an exception). Importing this module imports ``lightning``.
"""

from __future__ import annotations

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

    @property
    def agent(self) -> Any:
        """The rank's `mfuscope.agent.Agent` between train start and train end, else None."""
        return self._driver.agent

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        logger = getattr(trainer, "logger", None)
        default_job = getattr(logger, "name", None) or type(pl_module).__name__
        self._driver.start(model=pl_module, default_job=default_job)

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

    def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
        self._driver.close()
