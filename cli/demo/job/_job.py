"""The torch side of the demo job: process groups, model, agent and the two training schedules."""

from __future__ import annotations

import argparse
import contextlib
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import torch
import torch.distributed as dist
from mfuscope.cli.demo.job.tiny_gpt import GPTConfig, GPTStage, MarkovTokens, stage_layer_ranges
from torch.distributed.device_mesh import init_device_mesh
from torch.nn.parallel import DistributedDataParallel
from torch.utils.checkpoint import noop_context_fn

Emit = Callable[..., None]
PIPELINE_STAGES = 2
# Small DDP buckets (MB) so gradient all-reduces start during backward and overlap it, as they do
# in real jobs whose models span many 25 MB buckets.
DDP_BUCKET_CAP_MB = 0.5
STOP_CHECK_EVERY = 10  # steps between the ranks' agreement on a --max-seconds stop


class _StepAgent(Protocol):
    def step(self) -> AbstractContextManager[Any]: ...

    def close(self) -> None: ...


class _NoAgent:
    def step(self) -> AbstractContextManager[Any]:
        return contextlib.nullcontext()

    def close(self) -> None:
        return None


@dataclass(frozen=True)
class _Layout:
    """Where this rank sits: pipeline stage (0 without --pipeline) and data-parallel shard."""

    stage: int
    n_stages: int
    dp_rank: int
    dp_size: int

    @property
    def is_last_stage(self) -> bool:
        return self.stage == self.n_stages - 1


def _mesh_and_layout(pipeline: bool, world: int) -> tuple[Any, _Layout]:
    if not pipeline:
        mesh = init_device_mesh("cpu", (world,), mesh_dim_names=("dp",))
        (dp_rank,) = mesh.get_coordinate()
        return mesh, _Layout(stage=0, n_stages=1, dp_rank=dp_rank, dp_size=world)
    if world % PIPELINE_STAGES:
        raise SystemExit(f"--pipeline needs a multiple of {PIPELINE_STAGES} ranks, got {world}")
    dp_size = world // PIPELINE_STAGES
    mesh = init_device_mesh("cpu", (PIPELINE_STAGES, dp_size), mesh_dim_names=("pp", "dp"))
    stage, dp_rank = mesh.get_coordinate()
    return mesh, _Layout(stage=stage, n_stages=PIPELINE_STAGES, dp_rank=dp_rank, dp_size=dp_size)


def _make_agent(args: argparse.Namespace, model: Any, mesh: Any) -> tuple[_StepAgent, Any]:
    """The mfuscope agent and the checkpoint `context_fn` it provides (or no-ops)."""
    if args.no_agent:
        return _NoAgent(), noop_context_fn
    from mfuscope.agent import Agent, checkpoint_context

    jsonl = None if args.jsonl_dir is None else str(Path(args.jsonl_dir) / "rank{rank}.jsonl")
    agent = Agent(
        job=args.job,
        collector_url=args.collector_url,
        model=model,
        mesh=mesh,
        jsonl_path=jsonl,
        # Profile sooner and more often than the production defaults, so that a run of a minute
        # shows several refreshed decompositions (the agent still caps the amortised cost).
        profile_first_step=args.profile_first_step,
        profile_every_s=args.profile_every_s,
        profile_max_overhead_ratio=args.profile_max_overhead,
    )
    return agent, checkpoint_context


def _allreduce_mean(module: Any, group: Any, size: int) -> None:
    """Average gradients over `group` in one flat all-reduce (the pipeline's data parallelism)."""
    grads = [p.grad for p in module.parameters() if p.grad is not None]
    flat = torch.cat([g.flatten() for g in grads])
    dist.all_reduce(flat, group=group)
    flat /= size
    offset = 0
    for g in grads:
        g.copy_(flat[offset : offset + g.numel()].view_as(g))
        offset += g.numel()


def _mean_over(value: torch.Tensor, group: Any, size: int) -> float:
    """The mean of a scalar over `group`: the loss every data-parallel rank logs (a small
    all-reduce per step, as training loops do for logging)."""
    if size > 1:
        value = value.clone()
        dist.all_reduce(value, group=group)
        value /= size
    return float(value)


def _pipeline_step(
    stage: GPTStage,
    layout: _Layout,
    pp_group: Any,
    inputs: torch.Tensor,
    targets: torch.Tensor,
    microbatches: int,
) -> float | None:
    """One GPipe step over 2 stages; returns the step's mean loss on the last stage."""
    pending: list[tuple[Any, torch.Tensor]] = []  # keep sent tensors alive until sent
    loss_sum = 0.0
    if layout.stage == 0:
        outputs = []
        for chunk in inputs.chunk(microbatches):
            out = stage(chunk)
            sent = out.detach().contiguous()
            pending.append((dist.isend(sent, group=pp_group, group_dst=1), sent))
            outputs.append(out)
        for out in outputs:
            grad = torch.empty_like(out)
            dist.recv(grad, group=pp_group, group_src=1)
            out.backward(grad)
    else:
        width = stage.config.d_model
        for chunk in targets.chunk(microbatches):
            act = torch.empty(chunk.shape[0], chunk.shape[1], width)
            dist.recv(act, group=pp_group, group_src=0)
            act.requires_grad_()
            loss = stage(act, chunk) / microbatches
            loss.backward()
            loss_sum += float(loss.detach())
            grad = act.grad.contiguous()
            pending.append((dist.isend(grad, group=pp_group, group_dst=0), grad))
    for work, _tensor in pending:
        work.wait()
    return loss_sum if layout.is_last_stage else None


class _Trainer:
    """One training step of either schedule; returns the step's loss where this rank has it."""

    def __init__(
        self,
        args: argparse.Namespace,
        layout: _Layout,
        mesh: Any,
        stage: GPTStage,
        model: Any,
        optimizer: Any,
        data: MarkovTokens,
    ) -> None:
        self.args, self.layout, self.mesh = args, layout, mesh
        self.stage, self.model, self.optimizer, self.data = stage, model, optimizer, data

    def step(self, step: int) -> float | None:
        args, layout, mesh = self.args, self.layout, self.mesh
        inputs, targets = self.data.batch(step, layout.dp_rank, args.batch_size)
        loss: float | None
        if args.pipeline:
            pp = mesh.get_group("pp")
            loss = _pipeline_step(self.stage, layout, pp, inputs, targets, args.microbatches)
            if layout.dp_size > 1:
                _allreduce_mean(self.stage, mesh.get_group("dp"), layout.dp_size)
                if loss is not None:
                    loss = _mean_over(torch.tensor(loss), mesh.get_group("dp"), layout.dp_size)
        else:
            loss_tensor = self.model(inputs, targets)
            loss_tensor.backward()
            loss = _mean_over(loss_tensor.detach(), mesh.get_group("dp"), layout.dp_size)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return loss


def _any_rank_past(deadline: float) -> bool:
    """Whether any rank's clock passed its deadline: every rank must stop at the same step, so
    the ranks agree with one tiny all-reduce (MAX) between steps, outside the measured step."""
    flag = torch.tensor([1.0 if time.monotonic() >= deadline else 0.0])
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    return bool(flag.item() > 0)


def run(args: argparse.Namespace, emit: Emit) -> int:
    """Train for `args.steps` steps and/or `args.max_seconds`; progress goes through `emit`."""
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    mesh, layout = _mesh_and_layout(args.pipeline, world)
    lifecycle = rank == 0
    if lifecycle:
        axes = "pp x dp" if args.pipeline else "dp"
        emit("process_group_ready", world_size=world, backend="gloo", mesh=axes)
    config = GPTConfig(
        seq_len=args.seq_len,
        d_model=args.d_model,
        n_heads=args.heads,
        n_layers=args.layers,
        checkpoint_every=args.checkpoint_every,
    )
    torch.manual_seed(args.seed)  # the same initial weights on every data-parallel replica
    first, last = stage_layer_ranges(config.n_layers, layout.n_stages)[layout.stage]
    stage = GPTStage(config, first, last)
    data = MarkovTokens(config, seed=args.seed)
    if lifecycle:
        emit(
            "model_ready",
            parameters=sum(p.numel() for p in stage.parameters()),
            layers=config.n_layers,
            checkpointed_layers=stage.checkpointed_layers,
            stage=layout.stage,
            entropy_floor_nats=round(data.entropy_floor_nats, 4),
        )
    agent_started = time.monotonic()
    agent, context_fn = _make_agent(args, stage, mesh)
    if lifecycle:
        emit("agent_ready", enabled=not args.no_agent, seconds=time.monotonic() - agent_started)
    stage.context_fn = context_fn
    model: Any = stage
    if not args.pipeline and layout.dp_size > 1:
        model = DistributedDataParallel(
            stage, process_group=mesh.get_group("dp"), bucket_cap_mb=DDP_BUCKET_CAP_MB
        )
    optimizer = torch.optim.AdamW(stage.parameters(), lr=args.lr)
    trainer = _Trainer(args, layout, mesh, stage, model, optimizer, data)
    reports_loss = layout.is_last_stage and layout.dp_rank == 0
    deadline = None if args.max_seconds is None else time.monotonic() + args.max_seconds
    step = 0
    try:
        while args.steps is None or step < args.steps:
            started = time.monotonic()
            with agent.step():
                loss = trainer.step(step)
            stop = args.steps is not None and step == args.steps - 1
            if deadline is not None and step % STOP_CHECK_EVERY == STOP_CHECK_EVERY - 1:
                stop = stop or _any_rank_past(deadline)
            if reports_loss and (step % args.log_every == 0 or stop):
                emit("step", step=step, loss=round(loss or 0.0, 4),
                     seconds=time.monotonic() - started)  # fmt: skip
            step += 1
            if stop:
                break
    finally:
        if lifecycle:
            emit("training_done", steps=step)
        closing = time.monotonic()
        agent.close()  # flushes the last reports (and waits for an analysis in flight)
        if lifecycle:
            emit("agent_closed", seconds=time.monotonic() - closing)
        dist.destroy_process_group()
    if lifecycle:
        emit("done", steps=step)
    return 0
