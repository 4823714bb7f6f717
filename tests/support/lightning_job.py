"""A small MLP language model trained by Lightning on CPU/gloo with `MfuscopeCallback`.

Run under torchrun by tests/integration/test_framework_integrations.py:

    OMP_NUM_THREADS=1 torchrun --standalone --nproc_per_node=2 tests/support/lightning_job.py \
        --collector-url URL --out DIR --runs ddp:1 ddp:2 [--layers 2 --width 64 ...]

One `Trainer.fit` per `--runs STRATEGY:K` (strategy `ddp`, or `fsdp` where Lightning allows it:
on GPUs only; K the gradient accumulation factor), one after the other in the same process
group, each its own mfuscope job `lightning-<strategy>-ga<K>` writing `DIR/<job>-<rank>.jsonl`
besides the collector. `STRATEGY:K:phases` also validates and saves a checkpoint every 2 steps,
then fits again from the last checkpoint for one more epoch (job `<job>-phases-resumed`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import lightning
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.strategies import DDPStrategy, FSDPStrategy
from mfuscope.integrations.lightning import MfuscopeCallback
from torch import nn

from tests.support.framework_jobs import JobShape, agent_options, parse_job_args
from tests.support.job_exit import freeze_at_exit


class TokenMLP(lightning.LightningModule):
    """An embedding, `layers` residual MLP blocks (width -> 4 width -> width), an output head."""

    def __init__(self, shape: JobShape) -> None:
        super().__init__()
        width = shape.width
        self.embed = nn.Embedding(shape.vocab, width)
        self.blocks = nn.ModuleList(
            nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))
            for _ in range(shape.layers)
        )
        self.head = nn.Linear(width, shape.vocab, bias=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens)
        for block in self.blocks:
            x = x + block(x)
        return self.head(x)

    def training_step(self, batch: torch.Tensor, batch_idx: int) -> torch.Tensor:
        logits = self(batch)
        return nn.functional.cross_entropy(logits.flatten(0, 1), batch.flatten())

    def validation_step(self, batch: torch.Tensor, batch_idx: int) -> torch.Tensor:
        return self.training_step(batch, batch_idx)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.parameters(), lr=1e-3)


def train(
    strategy: str,
    grad_accum: int,
    shape: JobShape,
    collector_url: str,
    out: Path,
    phases: str = "",
    resume: Path | None = None,
) -> None:
    torch.manual_seed(0)
    job = f"lightning-{strategy}-ga{grad_accum}" + ("-phases" if phases else "")
    job += "-resumed" if resume else ""
    if strategy == "ddp":
        chosen: object = DDPStrategy(process_group_backend="gloo")
    else:
        chosen = FSDPStrategy(process_group_backend="gloo")
    callbacks: list[Any] = [MfuscopeCallback(**agent_options(job, collector_url, out))]
    if phases:  # a checkpoint every 2 optimizer steps, as users configure it
        every = ModelCheckpoint(dirpath=out / "ckpt", every_n_train_steps=2, save_last=True)
        callbacks.append(every)
    trainer = lightning.Trainer(
        accelerator="cpu" if strategy == "ddp" else "gpu",
        devices=2,
        strategy=chosen,
        accumulate_grad_batches=grad_accum,
        max_epochs=2 if resume else 1,
        callbacks=callbacks,
        logger=False,
        enable_checkpointing=bool(phases),
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=str(out),
        val_check_interval=2 if phases else None,
        num_sanity_val_steps=0,
        limit_val_batches=2 if phases else 0,
    )
    generator = torch.Generator().manual_seed(0)
    sequences = 2 * shape.batch * shape.micro_batches
    tokens = torch.randint(0, shape.vocab, (sequences, shape.seq_len), generator=generator)
    loader = torch.utils.data.DataLoader(tokens, batch_size=shape.batch)
    trainer.fit(
        TokenMLP(shape),
        train_dataloaders=loader,
        val_dataloaders=loader if phases else None,
        ckpt_path=str(resume) if resume else None,
    )


def main() -> None:
    freeze_at_exit()  # ~2 s of CPU per rank with torch and its framework loaded
    options, shape = parse_job_args("STRATEGY:K runs, one Trainer.fit each")
    for run in options.runs:
        strategy, grad_accum, phases = [*run.split(":"), ""][:3]
        train(strategy, int(grad_accum), shape, options.collector_url, options.out, phases)
        if phases:
            last = options.out / "ckpt" / "last.ckpt"
            train(
                strategy, int(grad_accum), shape, options.collector_url, options.out, phases, last
            )


if __name__ == "__main__":
    main()
