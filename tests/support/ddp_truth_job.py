"""A 2-rank gloo DDP job that knows its own exposed communication, for comparing the agent's
carried breakdown with ground truth on the shape of a real data-parallel loop
(`tests/support/ddp_truth.py`; the test in tests/integration and `benchmarks/ddp_truth.py` run it).

Run under torchrun:

    OMP_NUM_THREADS=1 PYTHONPATH=. torchrun --standalone --nproc_per_node=2 \
        tests/support/ddp_truth_job.py \
        --steps 300 --jsonl /tmp/ddp-{rank}.jsonl --truth /tmp/ddp-truth-{rank}.json \
        --option profile_first_step=10 --option profile_every_steps=60

The loop is a user's: a small GPT (SDPA attention) under plain `DistributedDataParallel` with
`bucket_cap_mb` small enough for 7-8 gradient buckets, so buckets are all-reduced while the backward
pass still runs; 2 micro-steps per optimizer step, the first under `no_sync()`; one `agent.step()`
per optimizer step; and its batches from a `DataLoader` whose dataset sleeps 25 ms (a loader that
is late) on one micro-step every 7 steps, at steps and micro-steps that differ between the ranks,
so that the other rank waits for it inside its all-reduce.

The truth comes from the job itself: a DDP communication hook, the default all-reduce with
timestamps, notes each bucket's launch, the return of its call into the process group (which only
enqueues the work) and, from a callback on its future on gloo's worker thread, its completion. What
`tests/support/ddp_truth.py` makes of them: the reducer's wait (from the last bucket's launch, when
the backward pass has computed the last gradient, to the last completion) and the calls that
launched the earlier buckets are exposed communication; the earlier buckets' flight during the
backward pass is overlapped; the sleep is idle.

Each rank writes ``{"steps": [{"step", "stall_s", "data_blocked_s", "launched", "called",
"completed", "backward_s", "clock"}, ...]}`` to `--truth` (``{rank}`` replaced): the stall's
seconds, the thread's blocked time in the loader, each bucket's launch, call return and completion
and the syncing backward's return (s after the step's start), and the training thread's
``/proc/thread-self/schedstat`` (CPU time, run delay, ns) with `perf_counter_ns` at the step's
start, the last bucket's launch, the syncing backward's return and the step's end, for scoring
carried rules offline (`benchmarks/carried_rules.py`). The agent runs with its ordinary options
plus `--option NAME=VALUE`.
"""

# No `from __future__ import annotations`: DDP checks the hook's annotations as objects.

import argparse
import contextlib
import os
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from mfuscope.agent import Agent
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, Dataset

from tests.support import job_exit

VOCAB, WIDTH, LAYERS, HEADS, SEQ = 512, 128, 4, 4, 64
MICRO_STEPS = 2
BUCKET_CAP_MB = 0.5  # ~3.7 MB of gradients: 7-8 buckets
# The data stall: (steps modulo STALL_EVERY, micro-step) per rank, and how long.
STALL_EVERY = 7
STALL_AT = {0: (3, 0), 1: (5, 1)}
STALL_S = 0.025


class Tokens(Dataset[torch.Tensor]):
    """Random token batches, one per micro-step, read through a `DataLoader` as a user's loop
    reads its data; on this rank's stall micro-steps it sleeps first (a loader that is late).
    `slept` holds each stall's measured seconds by item."""

    def __init__(self, rank: int, steps: int, batch: int) -> None:
        self.rank, self.steps, self.batch = rank, steps, batch
        self.slept: dict[int, float] = {}

    def __len__(self) -> int:
        return self.steps * MICRO_STEPS

    def __getitem__(self, item: int) -> torch.Tensor:
        step, micro = divmod(item, MICRO_STEPS)
        if (step % STALL_EVERY, micro) == STALL_AT[self.rank]:
            started = time.perf_counter()
            time.sleep(STALL_S)
            self.slept[item] = time.perf_counter() - started
        generator = torch.Generator().manual_seed(self.rank * 1_000_003 + item)
        return torch.randint(0, VOCAB, (self.batch, SEQ + 1), generator=generator)


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(WIDTH), nn.LayerNorm(WIDTH)
        self.qkv, self.proj = nn.Linear(WIDTH, 3 * WIDTH), nn.Linear(WIDTH, WIDTH)
        self.fc, self.out = nn.Linear(WIDTH, 4 * WIDTH), nn.Linear(4 * WIDTH, WIDTH)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = (
            z.view(b, t, HEADS, c // HEADS).transpose(1, 2)
            for z in self.qkv(self.ln1(x)).split(c, dim=2)
        )
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(b, t, c))
        return x + self.out(F.gelu(self.fc(self.ln2(x))))


class Gpt(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.wte, self.wpe = nn.Embedding(VOCAB, WIDTH), nn.Embedding(SEQ, WIDTH)
        self.blocks = nn.Sequential(*(Block() for _ in range(LAYERS)))
        self.ln_f, self.head = nn.LayerNorm(WIDTH), nn.Linear(WIDTH, VOCAB, bias=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.wte(tokens) + self.wpe(torch.arange(tokens.shape[1]))
        return self.head(self.ln_f(self.blocks(x)))


class Timestamps:
    """Each bucket's launch and the completion of its all-reduce (`perf_counter`, s), for the
    step in progress (`timed_allreduce_hook`'s state); `clock` reads the training thread's clock
    (called on it at the last bucket's launch)."""

    def __init__(self, group: dist.ProcessGroup, clock: Callable[[], list[int]]) -> None:
        self.group = group
        self.clock = clock
        self.launched: list[float] = []
        self.returned: list[float] = []  # when each launch's call into all_reduce returned
        self.completed: list[float] = []
        self.at_last_launch: list[int] = []

    def take(self) -> tuple[list[float], list[float], list[float], list[int]]:
        taken = self.launched, self.returned, self.completed, self.at_last_launch
        self.launched, self.returned, self.completed, self.at_last_launch = [], [], [], []
        return taken


def timed_allreduce_hook(
    state: Timestamps, bucket: dist.GradBucket
) -> torch.futures.Future[torch.Tensor]:
    """DDP's default all-reduce hook (`allreduce_hook`), noting the bucket's launch and, from a
    callback on its future (on gloo's worker thread), when its all-reduce completed. It calls
    the process group itself, as the reducer's built-in hook does: `dist.all_reduce`'s Python
    wrapper around the enqueue took up to 40 ms here under load (the GIL, a CPU), time the trace
    shows as nothing running with no collective enqueued yet."""
    tensor = bucket.buffer()
    tensor.div_(state.group.size())
    if bucket.is_last():
        state.at_last_launch = state.clock()
    state.launched.append(time.perf_counter())
    work = state.group.allreduce([tensor])
    state.returned.append(time.perf_counter())
    completed = state.completed

    def done(fut: torch.futures.Future[list[torch.Tensor]]) -> torch.Tensor:
        completed.append(time.perf_counter())
        return fut.value()[0]

    return work.get_future().then(done)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--jsonl", required=True)
    parser.add_argument("--truth", required=True)
    parser.add_argument("--option", action="append", default=[], help="agent NAME=VALUE")
    args = parser.parse_args()

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    clock = os.open("/proc/thread-self/schedstat", os.O_RDONLY)

    def read_clock() -> list[int]:
        """The training thread's CPU time and run delay (ns), and `perf_counter_ns`."""
        cpu, delay = os.pread(clock, 64, 0).split()[:2]
        return [int(cpu), int(delay), time.perf_counter_ns()]

    torch.manual_seed(0)
    model = DistributedDataParallel(Gpt(), bucket_cap_mb=BUCKET_CAP_MB)
    assert dist.group.WORLD is not None
    hook = Timestamps(dist.group.WORLD, read_clock)
    model.register_comm_hook(hook, timed_allreduce_hook)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    params = sum(p.numel() for p in model.parameters())
    tokens = MICRO_STEPS * args.batch * SEQ
    options: dict[str, object] = {"flops_per_step": 6.0 * params * tokens, "peak_flops": 1e11}
    options.update(item.split("=", 1) for item in args.option)
    agent = Agent(job="ddp-truth", jsonl_path=args.jsonl, **options)  # type: ignore[arg-type]
    data = Tokens(rank, args.steps, args.batch)
    batches = iter(DataLoader(data, batch_size=None))

    rows: list[dict[str, Any]] = []
    for step in range(args.steps):
        with agent.step():
            start = read_clock()
            waited = 0  # ns the thread was blocked fetching data (off the CPU, not asking)
            for micro in range(MICRO_STEPS):
                before = read_clock()
                batch = next(batches)
                after = read_clock()
                waited += after[2] - before[2] - (after[0] - before[0]) - (after[1] - before[1])
                last = micro == MICRO_STEPS - 1
                with contextlib.nullcontext() if last else model.no_sync():
                    logits = model(batch[:, :-1])
                    loss = F.cross_entropy(logits.reshape(-1, VOCAB), batch[:, 1:].reshape(-1))
                    loss.backward()
            returned = read_clock()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            end = read_clock()
        launched, called, completed, at_last = hook.take()
        base = start[2] / 1e9
        rows.append(
            {
                "step": step,
                "stall_s": sum(data.slept.get(step * MICRO_STEPS + m, 0.0) for m in range(2)),
                "data_blocked_s": waited / 1e9,
                # Each bucket's launch, the return of its call into all_reduce and its
                # completion; the return of the syncing `loss.backward()` (s after the start).
                "launched": [t - base for t in launched],
                "called": [t - base for t in called],
                "completed": [t - base for t in completed],
                "backward_s": returned[2] / 1e9 - base,
                # The training thread's (CPU ns, run delay ns, perf_counter ns) at the step's
                # start, the last bucket's launch, the syncing backward's return and the end.
                "clock": [start, at_last, returned, end],
            }
        )
    agent.close(60.0)
    os.close(clock)
    job_exit.finish(args.truth, {"steps": rows})


if __name__ == "__main__":
    job_exit.freeze_at_exit()
    main()
