"""mfuscope for torchtitan: run ``python -m mfuscope.integrations.torchtitan`` where you would run
``python -m torchtitan.train`` (same arguments), or call `instrument(trainer)` in your own
entry point.

torchtitan's ``Trainer.train`` calls ``train_step`` once per optimizer step (all gradient
accumulation and pipeline micro-batches inside), so wrapping ``train_step`` in ``agent.step()``
gives one mfuscope step per optimizer step. FLOPs come from torchtitan's own analytical count,
``metrics_processor.num_flops_per_token`` (the model's ``get_nparams_and_flops``): it is what
torchtitan's own MFU uses, so both report one number, and no slow counting step is needed.
The checkpoint manager's ``save`` and ``load`` are phases of the job-time ledger
(``checkpoint_save``, ``checkpoint_load``; docs/definitions.md#job-time-ledger): ``save`` is
called after every step and saves only when due (its own ``_should_save``), so only those calls
are phases. Importing this module imports no torchtitan; `main` does.
"""

from __future__ import annotations

import functools
from typing import Any

__all__ = ["flops_per_step", "instrument", "main"]


def flops_per_step(trainer: Any) -> float:
    """This rank's model FLOPs per optimizer step of a built torchtitan ``Trainer``, in FLOPs.

    ``num_flops_per_token`` (whole model, per token, training: 6 x matmul parameters plus the
    attention term, recomputation excluded) x the tokens one data-parallel rank processes per
    step (``local_batch_size x seq_len x gradient_accumulation_steps``), divided among the ranks
    that share those tokens (``cp x tp x pp``, torchtitan's ``non_data_parallel_size``): the
    same convention as torchtitan's own MFU, which assumes an even split.
    """
    per_token = float(trainer.metrics_processor.num_flops_per_token)
    if per_token <= 0:
        raise ValueError("torchtitan has not set num_flops_per_token yet (build the Trainer first)")
    training = trainer.config.training
    tokens = int(training.local_batch_size) * int(training.seq_len)
    tokens *= int(trainer.gradient_accumulation_steps)
    return per_token * tokens / int(trainer.parallel_dims.non_data_parallel_size)


def instrument(trainer: Any, **agent_options: Any) -> Any:
    """Create this rank's `Agent` for a built torchtitan ``Trainer`` and wrap its ``train_step``.

    Collective: call it on every rank. ``agent_options`` are `Agent(...)` keywords; for each
    option the keyword wins, then MFUSCOPE_<NAME>, then what this glue derives: ``flops_per_step``
    from `flops_per_step(trainer)` and ``job`` "torchtitan". Returns the Agent; close it after
    training.
    """
    from mfuscope.agent import Agent
    from mfuscope.agent.config import AgentConfig

    derived: dict[str, Any] = {"job": "torchtitan"}
    if AgentConfig.option("flops_per_step", agent_options) is None:  # not given by the user
        derived["flops_per_step"] = flops_per_step(trainer)
    agent = Agent(**agent_options, derived=derived)
    original = trainer.train_step

    @functools.wraps(original)
    def train_step(*args: Any, **kwargs: Any) -> Any:
        with agent.step():
            return original(*args, **kwargs)

    trainer.train_step = train_step
    checkpointer = getattr(trainer, "checkpointer", None)
    if checkpointer is not None:
        _mark_checkpoints(checkpointer, agent)
    return agent


def _mark_checkpoints(checkpointer: Any, agent: Any) -> None:
    """Wrap the checkpoint manager's ``save`` (when it will save) and ``load`` in phases."""
    save, load = checkpointer.save, checkpointer.load
    due = getattr(checkpointer, "_should_save", None)

    @functools.wraps(save)
    def marked_save(*args: Any, **kwargs: Any) -> Any:
        step = args[0] if args else kwargs.get("curr_step", 0)
        last = args[1] if len(args) > 1 else kwargs.get("last_step", False)
        if due is not None and not due(step, last):
            return save(*args, **kwargs)
        with agent.phase("checkpoint_save"):
            return save(*args, **kwargs)

    @functools.wraps(load)
    def marked_load(*args: Any, **kwargs: Any) -> Any:
        with agent.phase("checkpoint_load"):
            return load(*args, **kwargs)

    checkpointer.save, checkpointer.load = marked_save, marked_load


def _instrumented_train(train: Any) -> Any:
    @functools.wraps(train)
    def run(self: Any) -> Any:
        agent = instrument(self)
        try:
            return train(self)
        finally:
            agent.close()

    return run


def main() -> None:
    """torchtitan's own entry point with every rank's Trainer instrumented at ``train()``.

    Agent options come from MFUSCOPE_* variables (MFUSCOPE_JOB, MFUSCOPE_COLLECTOR_URL, ...).
    """
    from torchtitan import train as torchtitan_train
    from torchtitan.trainer import Trainer

    Trainer.train = _instrumented_train(Trainer.train)
    torchtitan_train.main()


if __name__ == "__main__":
    main()
