"""A small GPT-style transformer trained with DDP over gloo, instrumented with the mfuscope agent.

Run under torchrun (the agent tests and `benchmarks/agent_overhead.py` do):

    OMP_NUM_THREADS=1 torchrun --standalone --nproc_per_node=2 tests/integration/agent_job.py \
        --steps 20 --jsonl /tmp/out.jsonl --collector-url http://127.0.0.1:PORT

Every other block is activation-checkpointed with `checkpoint_context()`, so the profiled
windows hold recomputation. Each rank writes its own step times (measured here, outside the
agent) to `--times PATH` (`{rank}` replaced) as JSON, for the fault tests.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from mfuscope.agent import Agent, checkpoint_context
from mfuscope.agent._agent import Seams
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.checkpoint import checkpoint

VOCAB = 512
WIDTH = 64
HEADS = 4
LAYERS = 4
SEQ = 64
BATCH = 8


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(WIDTH)
        self.qkv = nn.Linear(WIDTH, 3 * WIDTH)
        self.proj = nn.Linear(WIDTH, WIDTH)
        self.norm2 = nn.LayerNorm(WIDTH)
        self.mlp = nn.Sequential(
            nn.Linear(WIDTH, 4 * WIDTH), nn.GELU(), nn.Linear(4 * WIDTH, WIDTH)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(b, t, 3, HEADS, WIDTH // HEADS).unbind(2)
        attn = F.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True
        )
        x = x + self.proj(attn.transpose(1, 2).reshape(b, t, WIDTH))
        return x + self.mlp(self.norm2(x))


class TinyGPT(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, WIDTH)
        self.blocks = nn.ModuleList(Block() for _ in range(LAYERS))
        self.head = nn.Linear(WIDTH, VOCAB)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens)
        for i, block in enumerate(self.blocks):
            if i % 2 == 0:
                x = checkpoint(block, x, use_reentrant=False, context_fn=checkpoint_context)
            else:
                x = block(x)
        return self.head(x)


def build(seed: int = 0) -> tuple[nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(seed)
    # Small buckets: several all-reduces per step, most of them overlapping the backward pass.
    model = DistributedDataParallel(TinyGPT(), bucket_cap_mb=0.25)
    return model, torch.optim.AdamW(model.parameters(), lr=1e-3)


def train_step(model: nn.Module, optimizer: torch.optim.Optimizer, step: int) -> None:
    generator = torch.Generator().manual_seed(step * 101 + dist.get_rank())
    tokens = torch.randint(0, VOCAB, (BATCH, SEQ + 1), generator=generator)
    logits = model(tokens[:, :-1])
    loss = F.cross_entropy(logits.reshape(-1, VOCAB), tokens[:, 1:].reshape(-1))
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


class _FailingProfiler:
    """Stands in for torch.profiler when the fault test asks for a profiler that fails."""

    def start(self) -> None:
        raise RuntimeError("injected profiler failure")

    def stop(self) -> None:
        return None

    def export_chrome_trace(self, path: str) -> Any:
        return None


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--job", default="agent-e2e")
    parser.add_argument("--jsonl")
    parser.add_argument("--collector-url")
    parser.add_argument("--times", help="write this rank's step times (s) as JSON here")
    parser.add_argument("--fail-profiler", action="store_true")
    parser.add_argument("--close-timeout-s", type=float, default=10.0)
    parser.add_argument("--option", action="append", default=[], help="agent NAME=VALUE")
    args = parser.parse_args()

    dist.init_process_group("gloo")
    model, optimizer = build()
    options: dict[str, object] = dict(item.split("=", 1) for item in args.option)
    seams = Seams(profiler_factory=_FailingProfiler) if args.fail_profiler else None
    agent = Agent(
        job=args.job,
        collector_url=args.collector_url,
        model=model,
        jsonl_path=args.jsonl,
        seams=seams,
        **options,  # strings: the agent parses them as it parses MFUSCOPE_* variables
    )
    times = []
    for step in range(args.steps):
        started = time.perf_counter()
        with agent.step():
            train_step(model, optimizer, step)
        times.append(time.perf_counter() - started)
    closing = time.perf_counter()
    agent.close(args.close_timeout_s)
    close_s = time.perf_counter() - closing
    if args.times:
        path = args.times.replace("{rank}", str(dist.get_rank()))
        with open(path, "w") as handle:
            json.dump({"step_s": times, "close_s": close_s, "health": _health(agent)}, handle)
    dist.barrier()
    dist.destroy_process_group()


def _health(agent: Agent) -> dict[str, int]:
    snapshot = agent.health.snapshot()
    return {
        "reports_dropped_total": snapshot.reports_dropped_total,
        "send_failures_total": snapshot.send_failures_total,
        "profiler_failures_total": snapshot.profiler_failures_total,
        "windows_analysed_total": snapshot.windows_analysed_total,
        "internal_errors": agent.health.internal_errors,
    }


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
