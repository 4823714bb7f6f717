"""mfuscope for the `transformers` Trainer: ``Trainer(callbacks=[MfuscopeCallback()])``.

One mfuscope step per optimizer step: the step opens at ``on_step_begin`` (the Trainer calls it
before the first micro-batch of a gradient-accumulation cycle) and closes at ``on_step_end``
(after ``optimizer.step()``), so its wall time and its counted FLOPs cover every micro-batch of
the cycle. The Agent is created at ``on_train_begin``, which the Trainer calls on every rank
(the process group, set up by ``accelerate`` or ``torchrun``, already exists), and closed at
``on_train_end``. Importing this module imports ``transformers``.

Evaluations and checkpoint saves between steps are phases of the job-time ledger
(docs/definitions.md#job-time-ledger), with no user code: the Trainer decides at the end of a
step (or an epoch) whether to evaluate and save, in the flags its own flow callback sets on
``control`` before ours runs, then logs, evaluates (``on_evaluate`` at its end) and saves
(``on_save`` at its end). So an ``evaluation`` phase opens at ``on_step_end`` when it is due,
a ``checkpoint_save`` phase when a save is due (at ``on_evaluate`` if both are), and each closes
at its callback; the logging before an evaluation counts in it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mfuscope.integrations._driver import AgentDriver, framework_missing

try:
    from transformers import TrainerCallback
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise framework_missing("transformers", "huggingface") from exc

__all__ = ["MfuscopeCallback", "estimated_flops_per_step"]


def estimated_flops_per_step(model: Any, args: Any, seq_len: int) -> float:
    """This rank's model FLOPs per optimizer step from transformers' own estimate, in FLOPs.

    The Trainer's ``floating_point_ops`` is 6 x non-embedding parameters
    (``model.num_parameters(exclude_embeddings=True)``) x tokens: it leaves out the attention
    score matrices and, with tied embeddings, the output projection, so it understates a counted
    step (docs/integrations.md). Tokens per step on this rank:
    ``per_device_train_batch_size x gradient_accumulation_steps x seq_len``.
    """
    sequences = int(args.per_device_train_batch_size) * int(args.gradient_accumulation_steps)
    parameters = int(model.num_parameters(exclude_embeddings=True))
    return 6.0 * parameters * sequences * seq_len


class MfuscopeCallback(TrainerCallback):  # type: ignore[misc]
    """Live MFU for a `transformers.Trainer` job; ``agent_options`` are `Agent(...)` keywords.

    ``job`` defaults to the Trainer's ``run_name`` when neither ``job=`` nor MFUSCOPE_JOB is
    set. FLOPs are counted by the agent on the first step (attention included) unless
    ``flops_per_step`` (or MFUSCOPE_FLOPS_PER_STEP) is given; with ``count_flops=False`` (or
    MFUSCOPE_COUNT_FLOPS=0) and ``seq_len`` (tokens per sequence) transformers' own estimate is
    used instead (`estimated_flops_per_step`).
    """

    def __init__(self, *, seq_len: int | None = None, **agent_options: Any) -> None:
        self._driver = AgentDriver(agent_options)
        self._seq_len = seq_len

    @property
    def agent(self) -> Any:
        """The rank's `mfuscope.agent.Agent` between train begin and train end, else None."""
        return self._driver.agent

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        model = kwargs.get("model")
        derived: dict[str, Any] = {}
        driver = self._driver
        # count_flops=False (keyword or MFUSCOPE_COUNT_FLOPS=0) asks for the estimate; FLOPs the
        # user gave (keyword or MFUSCOPE_FLOPS_PER_STEP) need none.
        wanted = driver.option("count_flops") is False and driver.option("flops_per_step") is None
        if wanted and self._seq_len:
            if not hasattr(model, "num_parameters"):
                raise ValueError("seq_len= needs a transformers PreTrainedModel (num_parameters)")
            derived["flops_per_step"] = estimated_flops_per_step(model, args, self._seq_len)
        default_job = args.run_name or Path(str(args.output_dir)).name or None
        driver.start(model=model, default_job=default_job, **derived)

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._driver.begin_step()

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._driver.end_step()
        self._phase_due(control)

    def on_epoch_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._phase_due(control)

    def on_evaluate(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._driver.end_phase()
        if getattr(control, "should_save", False):
            self._driver.begin_phase("checkpoint_save")

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._driver.end_phase()

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._driver.close()

    def _phase_due(self, control: Any) -> None:
        """Open the phase the Trainer will run next, as its flow callback set `control`."""
        if getattr(control, "should_evaluate", False):
            self._driver.begin_phase("evaluation")
        elif getattr(control, "should_save", False):
            self._driver.begin_phase("checkpoint_save")
