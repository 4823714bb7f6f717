"""One 4-rank gloo job that trains a small MLP under each parallel layout, with the agent counting
FLOPs, and writes each layout's reports to its own JSONL files.

Run under torchrun (`tests/integration/test_sharded_flops.py` does):

    OMP_NUM_THREADS=1 PYTHONPATH=. torchrun --standalone --nproc_per_node=4 \
        tests/support/sharded_flops_job.py OUT_DIR [--collector-url URL] [LAYOUT ...]

Every layout trains the same MLP, ``up = Linear(IN, HIDDEN)``, ReLU, ``down = Linear(HIDDEN, OUT)``
(with biases), on inputs of shape (BATCH, SEQ, IN) per data-parallel rank, for STEPS steps
(`sharded_flops_shape.py`); the test derives each layout's per-rank FLOPs by hand from them.
Layouts (4 ranks):

- ``tp``: a 2 x 2 ("dp", "tp") mesh, ``up`` ColwiseParallel, ``down`` RowwiseParallel; gradients
  all-reduced over dp by hand.
- ``tp_sp``: as ``tp`` with sequence parallelism: a LayerNorm under SequenceParallel before
  ``up`` (ColwiseParallel from a Shard(1) input), ``down`` back to Shard(1); each tp rank feeds
  its SEQ / tp share of the tokens.
- ``tp_recompute``: as ``tp``, the MLP activation-checkpointed with `checkpoint_context`
  (early stop off, so the recomputation is one whole forward).
- ``fsdp``: FSDP2 (`fully_shard`) over all 4 ranks.
- ``fsdp_tp``: the 2-D layout: TP on "tp", then `fully_shard` on "dp".
- ``pp``: a 2 x 2 ("pp", "dp") mesh; stage 0 is ``up`` + ReLU, stage 1 is ``down``, a GPipe
  schedule over MICROBATCHES micro-batches; gradients all-reduced over dp by hand.
- ``pp_1f1b``: as ``pp`` with a 1F1B schedule.
- ``varying``: plain data parallelism (DDP) with the batch size changing every step
  (VARYING_BATCHES), so the agent must count every new shape on its own step.

`{OUT}/{layout}-{rank}.jsonl` holds the layout's wire batches; with `--collector-url` they also go
to that collector, as job `flops-{layout}`.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist
from mfuscope.agent import Agent, checkpoint_context
from torch import nn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe
from torch.distributed.tensor import Shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    RowwiseParallel,
    SequenceParallel,
    parallelize_module,
)
from torch.nn.parallel import DistributedDataParallel
from torch.utils.checkpoint import checkpoint, set_checkpoint_early_stop

from tests.support import job_exit
from tests.support.sharded_flops_shape import (
    BATCH,
    HIDDEN,
    IN,
    MICROBATCHES,
    OUT,
    SEQ,
    STEPS,
    VARYING_BATCHES,
)


class MLP(nn.Module):
    def __init__(self, norm: bool = False, recompute: bool = False) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(IN) if norm else nn.Identity()
        self.up = nn.Linear(IN, HIDDEN)
        self.down = nn.Linear(HIDDEN, OUT)
        self.recompute = recompute

    def block(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(torch.relu(self.up(self.norm(x))))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.recompute:
            return checkpoint(self.block, x, use_reentrant=False, context_fn=checkpoint_context)
        return self.block(x)


@dataclass(frozen=True)
class Sinks:
    """Where every layout's agent sends its reports."""

    out: Path
    collector_url: str | None


def _agent(layout: str, sinks: Sinks, model: nn.Module, mesh: DeviceMesh | None) -> Agent:
    return Agent(
        job=f"flops-{layout}",
        jsonl_path=str(sinks.out / f"{layout}-{{rank}}.jsonl"),
        collector_url=sinks.collector_url,
        model=model,
        mesh=mesh,
        peak_flops=1e12,  # given: no CPU calibration
        profile=False,
        hardware_counters=False,
        flush_interval_s=0.0,
    )


def _inputs(step: int, batch: int = BATCH, seq: int = SEQ) -> torch.Tensor:
    generator = torch.Generator().manual_seed(1000 * step + dist.get_rank())
    return torch.randn(batch, seq, IN, generator=generator)


def _sync_grads(model: nn.Module, group: dist.ProcessGroup) -> None:
    for parameter in model.parameters():
        if parameter.grad is not None:
            grad = parameter.grad
            local = grad.to_local() if hasattr(grad, "to_local") else grad
            dist.all_reduce(local, group=group)


def _train(
    layout: str,
    sinks: Sinks,
    model: nn.Module,
    mesh: DeviceMesh | None,
    forward_backward: Callable[[int], None],
    steps: int = STEPS,
) -> None:
    """`steps` steps of `forward_backward(step)` then an SGD step, each an `agent.step()`."""
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    agent = _agent(layout, sinks, model, mesh)
    for step in range(steps):
        with agent.step():
            forward_backward(step)
            optimizer.step()
            optimizer.zero_grad()
    agent.close()
    dist.barrier()


def _tp_plan(sequence_parallel: bool) -> dict[str, object]:
    if sequence_parallel:
        return {
            "norm": SequenceParallel(),
            "up": ColwiseParallel(input_layouts=Shard(1)),
            "down": RowwiseParallel(output_layouts=Shard(1)),
        }
    return {"up": ColwiseParallel(), "down": RowwiseParallel()}


def run_tp(sinks: Sinks, layout: str) -> None:
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    sequence_parallel = layout == "tp_sp"
    torch.manual_seed(0)
    model = MLP(norm=sequence_parallel, recompute=layout == "tp_recompute")
    parallelize_module(model, mesh["tp"], _tp_plan(sequence_parallel))
    tp = mesh["tp"].size()

    def forward_backward(step: int) -> None:
        # Every tp rank of a dp rank feeds the same tokens; under SP each its SEQ / tp share.
        x = _inputs(step)
        if sequence_parallel:
            x = x.chunk(tp, dim=1)[mesh["tp"].get_local_rank()]
        with set_checkpoint_early_stop(False):
            loss = model(x).pow(2).mean()
        loss.backward()
        _sync_grads(model, mesh["dp"].get_group())

    _train(layout, sinks, model, mesh, forward_backward)


def run_fsdp(sinks: Sinks, layout: str) -> None:
    torch.manual_seed(0)
    model = MLP()
    if layout == "fsdp_tp":
        mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
        parallelize_module(model, mesh["tp"], _tp_plan(sequence_parallel=False))
        dp_mesh = mesh["dp"]
    else:
        mesh = dp_mesh = init_device_mesh("cpu", (4,), mesh_dim_names=("dp",))
    fully_shard(model.up, mesh=dp_mesh)
    fully_shard(model.down, mesh=dp_mesh)
    fully_shard(model, mesh=dp_mesh)

    def forward_backward(step: int) -> None:
        model(_inputs(step)).pow(2).mean().backward()

    _train(layout, sinks, model, mesh, forward_backward)


def run_pp(sinks: Sinks, layout: str) -> None:
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("pp", "dp"))
    stage_index = mesh["pp"].get_local_rank()
    torch.manual_seed(0)
    full = MLP()
    stage_module: nn.Module = (
        nn.Sequential(full.up, nn.ReLU()) if stage_index == 0 else nn.Sequential(full.down)
    )
    stage = PipelineStage(
        stage_module, stage_index, 2, torch.device("cpu"), group=mesh["pp"].get_group()
    )
    kind = Schedule1F1B if layout == "pp_1f1b" else ScheduleGPipe
    schedule = kind(
        stage, n_microbatches=MICROBATCHES, loss_fn=lambda output, _: output.pow(2).mean()
    )

    def forward_backward(step: int) -> None:
        # Both stages of a dp rank see the same batch: stage 0 its inputs, stage 1 the target.
        x = _inputs(step)
        if stage_index == 0:
            schedule.step(x)
        else:
            schedule.step(target=torch.zeros(BATCH, SEQ, OUT))
        _sync_grads(stage_module, mesh["dp"].get_group())

    _train(layout, sinks, stage_module, mesh, forward_backward)


def run_varying(sinks: Sinks, layout: str) -> None:
    torch.manual_seed(0)
    model = DistributedDataParallel(MLP())

    def forward_backward(step: int) -> None:
        model(_inputs(step, batch=VARYING_BATCHES[step])).pow(2).mean().backward()

    _train(layout, sinks, model, None, forward_backward, steps=len(VARYING_BATCHES))


LAYOUTS: dict[str, Callable[[Sinks, str], None]] = {
    "tp": run_tp,
    "tp_sp": run_tp,
    "tp_recompute": run_tp,
    "fsdp": run_fsdp,
    "fsdp_tp": run_fsdp,
    "pp": run_pp,
    "pp_1f1b": run_pp,
    "varying": run_varying,
}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out", type=Path)
    parser.add_argument("layouts", nargs="*", help=f"some of {', '.join(LAYOUTS)} (default: all)")
    parser.add_argument("--collector-url")
    args = parser.parse_args()
    sinks = Sinks(args.out, args.collector_url)
    dist.init_process_group("gloo")
    try:
        for layout in args.layouts or list(LAYOUTS):
            LAYOUTS[layout](sinks, layout)
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    job_exit.freeze_at_exit()
    main()
