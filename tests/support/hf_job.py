"""A tiny GPT-2 trained by the `transformers` Trainer on CPU/gloo with `MfuscopeCallback`.

Run under `accelerate launch` by tests/integration/test_framework_integrations.py (`torchrun`
works the same):

    OMP_NUM_THREADS=1 accelerate launch --multi_gpu --num_processes=2 tests/support/hf_job.py \
        --collector-url URL --out DIR --runs 1 2 [--layers 2 --width 64 ...]

One Trainer run per `--runs` value (the gradient accumulation factor k, or `k:phases` to also
evaluate and save a checkpoint every 2 steps), one after the other in the same process group,
each its own mfuscope job `hf-ga<k>` (`hf-ga<k>-phases`) writing `DIR/<job>-<rank>.jsonl` besides
the collector. The model is built from a config (no weights are downloaded); attention
is the eager matmul implementation, so the counted FLOPs follow the formula the test derives.
"""

from __future__ import annotations

from pathlib import Path

import torch
from mfuscope.integrations.huggingface import MfuscopeCallback
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

from tests.support.framework_jobs import JobShape, agent_options, parse_job_args
from tests.support.job_exit import freeze_at_exit


class RandomTokens(torch.utils.data.Dataset[dict[str, torch.Tensor]]):
    def __init__(self, sequences: int, shape: JobShape) -> None:
        generator = torch.Generator().manual_seed(0)
        self.tokens = torch.randint(0, shape.vocab, (sequences, shape.seq_len), generator=generator)

    def __len__(self) -> int:
        return len(self.tokens)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.tokens[index], "labels": self.tokens[index]}


def train(
    grad_accum: int, shape: JobShape, collector_url: str, out: Path, phases: bool = False
) -> None:
    torch.manual_seed(0)
    config = GPT2Config(
        n_layer=shape.layers,
        n_embd=shape.width,
        n_head=shape.heads,
        vocab_size=shape.vocab,
        n_positions=shape.seq_len,
        bos_token_id=None,
        eos_token_id=None,
    )
    config._attn_implementation = "eager"
    job = f"hf-ga{grad_accum}" + ("-phases" if phases else "")
    # With phases: an evaluation and a checkpoint save every 2 steps, nothing else told to the
    # callback (the integration marks them itself).
    every = {"eval_strategy": "steps", "eval_steps": 2, "save_strategy": "steps", "save_steps": 2}
    args = TrainingArguments(
        output_dir=str(out / job),
        run_name=job,
        per_device_train_batch_size=shape.batch,
        gradient_accumulation_steps=grad_accum,
        num_train_epochs=1,
        use_cpu=True,
        ddp_backend="gloo",
        ddp_find_unused_parameters=False,
        report_to="none",
        logging_strategy="no",
        disable_tqdm=True,
        **(every if phases else {"save_strategy": "no"}),
    )
    options = agent_options(job, collector_url, out)
    del options["job"]  # the callback takes the Trainer's run_name
    world = torch.distributed.get_world_size()
    trainer = Trainer(
        model=GPT2LMHeadModel(config),
        args=args,
        train_dataset=RandomTokens(world * shape.batch * shape.micro_batches, shape),
        eval_dataset=RandomTokens(world * shape.batch, shape) if phases else None,
        callbacks=[MfuscopeCallback(**options)],
    )
    trainer.train()


def main() -> None:
    freeze_at_exit()  # ~2 s of CPU per rank with torch and its framework loaded
    options, shape = parse_job_args("gradient accumulation factors, one Trainer run each")
    for run in options.runs:
        grad_accum, _, phases = run.partition(":")
        train(int(grad_accum), shape, options.collector_url, options.out, phases == "phases")


if __name__ == "__main__":
    main()
