"""The Trainer callback in one process: the Agent is made at train begin, one step spans
``on_step_begin`` .. ``on_step_end`` whatever happens between (micro-batches), the agent is
closed at train end; with counting off, the model's own estimate is the step's FLOPs."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from mfuscope.core.schema import decode_batch

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("transformers") is None, reason="needs transformers (the dev extra)"
)

LAYERS, WIDTH, VOCAB, SEQ_LEN = 2, 64, 256, 32


def MfuscopeCallback(**options: Any) -> Any:
    """The callback, imported at its first use, not at collection: transformers takes seconds
    to import, which every worker of every run would pay."""
    from mfuscope.integrations.huggingface import MfuscopeCallback as callback

    return callback(**options)


def tiny_gpt2() -> Any:
    import transformers

    config = transformers.GPT2Config(
        n_layer=LAYERS, n_embd=WIDTH, n_head=4, vocab_size=VOCAB, n_positions=SEQ_LEN,
        bos_token_id=None, eos_token_id=None,
    )  # fmt: skip
    return transformers.GPT2LMHeadModel(config)


def trainer_args(tmp_path: Path, grad_accum: int) -> Any:
    # The fields the callback reads from TrainingArguments.
    return SimpleNamespace(
        run_name=None,
        output_dir=str(tmp_path / "my-run"),
        per_device_train_batch_size=4,
        gradient_accumulation_steps=grad_accum,
    )


def reports(path: Path) -> list[Any]:
    return [r for line in path.read_text().splitlines() for r in decode_batch(line).reports]


def test_one_step_per_optimizer_step_and_the_models_estimate(tmp_path: Path) -> None:
    callback = MfuscopeCallback(
        seq_len=SEQ_LEN,
        count_flops=False,
        jsonl_path=str(tmp_path / "r.jsonl"),
        profile=False,
        calibrate_cpu_peak=False,
        peak_flops=1e11,
    )
    args, model = trainer_args(tmp_path, grad_accum=2), tiny_gpt2()
    callback.on_train_begin(args, None, None, model=model)
    assert callback.agent.config.job == "my-run"  # the output folder's name: no run_name
    for _ in range(3):
        callback.on_step_begin(args, None, None)
        callback.on_substep_end(args, None, None)  # the first micro-batch
        callback.on_step_end(args, None, None)
    callback.on_train_end(args, None, None)
    assert callback.agent is None
    # transformers' estimate: 6 x non-embedding parameters x tokens. Per layer two LayerNorms
    # (2 x 2d), qkv 3d^2 + 3d, attention out d^2 + d, MLP 4d^2 + 4d and 4d^2 + d: 12 d^2 + 13 d;
    # the final LayerNorm 2d; the output head is tied to the token embedding, so excluded.
    params = LAYERS * (12 * WIDTH**2 + 13 * WIDTH) + 2 * WIDTH
    tokens = 4 * 2 * SEQ_LEN
    got = reports(tmp_path / "r.jsonl")
    assert [r.step for r in got] == [0, 1, 2]
    assert {r.model_flops for r in got} == {6.0 * params * tokens}


def _started(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, env: dict[str, str], **options: Any
) -> Any:
    """The agent a callback starts with `options` under `env` (then closed)."""
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    callback = MfuscopeCallback(
        seq_len=SEQ_LEN, profile=False, hardware_counters=False, peak_flops=1e11, **options
    )
    args = SimpleNamespace(
        run_name="the-run", output_dir=str(tmp_path), per_device_train_batch_size=4,
        gradient_accumulation_steps=1,
    )  # fmt: skip
    callback.on_train_begin(args, None, None, model=tiny_gpt2())
    agent = callback.agent
    callback.on_train_end(args, None, None)
    return agent


def test_user_options_then_environment_then_the_models_estimate(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    estimate = 6.0 * (LAYERS * (12 * WIDTH**2 + 13 * WIDTH) + 2 * WIDTH) * 4 * SEQ_LEN
    # MFUSCOPE_COUNT_FLOPS=0 asks for the estimate as count_flops=False does; run_name is the job
    agent = _started(tmp_path, monkeypatch, {"MFUSCOPE_COUNT_FLOPS": "0"})
    assert (agent.config.flops_per_step, agent.config.job) == (estimate, "the-run")
    # the user's MFUSCOPE_FLOPS_PER_STEP and MFUSCOPE_JOB win over what the callback derives
    env = {"MFUSCOPE_FLOPS_PER_STEP": "123", "MFUSCOPE_JOB": "env-job"}
    agent = _started(tmp_path, monkeypatch, env, count_flops=False)
    assert (agent.config.flops_per_step, agent.config.job) == (123.0, "env-job")
    # and the user's keywords win over the environment
    agent = _started(tmp_path, monkeypatch, env, count_flops=False, flops_per_step=7.0, job="arg")
    assert (agent.config.flops_per_step, agent.config.job) == (7.0, "arg")


@pytest.mark.parametrize(
    ("evaluate", "save"), [(True, True), (True, False), (False, True), (False, False)]
)
def test_evaluations_and_saves_the_trainer_runs_are_phases(
    tmp_path: Path, evaluate: bool, save: bool
) -> None:
    """The Trainer's flow callback sets `control` at a step's end; the Trainer then evaluates
    (`on_evaluate` at its end) and saves (`on_save` at its end)."""
    path = tmp_path / "r.jsonl"
    callback = MfuscopeCallback(
        jsonl_path=str(path), profile=False, peak_flops=1e11, flops_per_step=1e9
    )
    args = trainer_args(tmp_path, grad_accum=1)
    callback.on_train_begin(args, None, None, model=tiny_gpt2())
    control = SimpleNamespace(should_evaluate=evaluate, should_save=save)
    for _ in range(2):
        callback.on_step_begin(args, None, control)
        callback.on_step_end(args, None, control)
        if evaluate:
            callback.on_evaluate(args, None, control)
        if save:
            callback.on_save(args, None, control)
    callback.on_train_end(args, None, None)
    ledger = decode_batch(path.read_text().splitlines()[-1]).ledger
    assert ledger is not None
    assert (ledger.evaluation_ns > 0, ledger.checkpoint_save_ns > 0) == (evaluate, save)
    assert len(reports(path)) == 2
