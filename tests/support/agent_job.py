"""The demo's GPT model trained with DDP over gloo, instrumented with the mfuscope agent.

Run on 2 ranks (the agent tests do, with `tests/support/launch.py` or torchrun):

    OMP_NUM_THREADS=1 torchrun --standalone --nproc_per_node=2 tests/support/agent_job.py \
        --steps 20 --jsonl /tmp/out.jsonl --collector-url http://127.0.0.1:PORT

The model and data are the packaged demo's (`mfuscope.cli.demo.job.tiny_gpt`): every other block is
activation-checkpointed with `checkpoint_context()`, so the profiled windows hold recomputation.
Unlike `mfuscope demo` there is no DeviceMesh (the group's axis is `world`) and the agent takes test
options (`--option`, `--fail-profiler`). Each rank writes its own step times (measured here, outside
the agent) and the agent's threads to `--times PATH` (`{rank}` replaced) as JSON, for the fault
tests. For the restart test, `--first-step N` numbers the steps from N (a job resumed from the
checkpoint of step N), and `--hang-after K` stops training after K steps without closing the agent
(its sender keeps shipping), so that the test can kill the job mid-run; each rank writes its process
id to `--pid-file PATH` (`{rank}` replaced) for that (torchrun and `tests/support/launch.py` start
their workers in sessions of their own, so killing the launcher's process group leaves them).

`--burn-analysis-s S` makes rank 1's window analyses spend S more seconds of CPU (its measured
window cost grows), for the test of windows aligned across ranks with different costs.

`--duration-s` runs for that long instead of `--steps`, and `--slow-after-s` with `--slow-factor F`
makes every step after that point F times as long by sleeping inside the step (the device idles: the
decomposition's bubble_idle grows). Both are decided before each step on the slowest rank's clock,
so every rank runs the same steps (a rank that stopped early would leave its peers blocked in a
collective)."""

from __future__ import annotations

import argparse
import itertools
import os
import statistics
import threading
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from mfuscope.agent import Agent, checkpoint_context
from mfuscope.agent._agent import Seams, agent_with_seams
from mfuscope.cli.demo.job.tiny_gpt import GPTConfig, GPTStage, MarkovTokens
from torch import nn
from torch.nn.parallel import DistributedDataParallel

CONFIG = GPTConfig(
    vocab_size=512, seq_len=64, d_model=64, n_heads=4, n_layers=4, checkpoint_every=2
)
BATCH = 8
DATA = MarkovTokens(CONFIG)


def build(seed: int = 0) -> tuple[nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(seed)
    # Small buckets: several all-reduces per step, most of them overlapping the backward pass.
    model = DistributedDataParallel(
        GPTStage(CONFIG, context_fn=checkpoint_context), bucket_cap_mb=0.25
    )
    return model, torch.optim.AdamW(model.parameters(), lr=1e-3)


def train_step(model: nn.Module, optimizer: torch.optim.Optimizer, step: int) -> None:
    inputs, targets = DATA.batch(step, dist.get_rank(), BATCH)
    model(inputs, targets).backward()
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
    parser.add_argument("--first-step", type=int, default=0)
    parser.add_argument("--hang-after", type=int, help="stop after this many steps; never exit")
    parser.add_argument("--pid-file", help="write this rank's process id here")
    parser.add_argument("--option", action="append", default=[], help="agent NAME=VALUE")
    parser.add_argument("--duration-s", type=float, help="run about this long, not --steps")
    parser.add_argument("--slow-after-s", type=float, help="slow every step down from here on")
    parser.add_argument("--slow-factor", type=float, default=1.0)
    parser.add_argument(
        "--step-sleep-s", type=float, default=0.0, help="sleep this long in every step (s)"
    )
    parser.add_argument("--burn-analysis-s", type=float, default=0.0, help="rank 1 analyses")
    args = parser.parse_args()

    dist.init_process_group("gloo")
    if args.pid_file:
        Path(args.pid_file.replace("{rank}", str(dist.get_rank()))).write_text(str(os.getpid()))
    model, optimizer = build()
    options: dict[str, object] = dict(item.split("=", 1) for item in args.option)
    before = set(threading.enumerate())
    seams = Seams(
        profiler_factory=_FailingProfiler if args.fail_profiler else None,
        analyse=_burning_analyse(args.burn_analysis_s) if dist.get_rank() == 1 else None,
    )
    agent = agent_with_seams(
        seams,
        job=args.job,
        collector_url=args.collector_url,
        model=model,
        jsonl_path=args.jsonl,
        first_step=args.first_step,
        **options,  # strings: the agent parses them as it parses MFUSCOPE_* variables
    )
    times: list[float] = []
    pace = _Pace(args)
    for index in itertools.count():
        if args.hang_after is not None and index >= args.hang_after:
            while True:  # the test kills the job here
                time.sleep(1)
        sleep_s = pace.sleep_s(index, times)
        if sleep_s is None:
            break
        step = args.first_step + index
        started = time.perf_counter()
        with agent.step():
            train_step(model, optimizer, step)
            time.sleep(sleep_s + args.step_sleep_s)
        times.append(time.perf_counter() - started)
    # The agent's own threads (Python threads started since it was built), before close.
    threads = sorted(t.name for t in threading.enumerate() if t not in before and t.is_alive())
    closing = time.perf_counter()
    agent.close(args.close_timeout_s)
    close_s = time.perf_counter() - closing
    record = {"step_s": times, "close_s": close_s, "health": _health(agent), "threads": threads}
    job_exit.finish(args.times, record)


class _Pace:
    """When to stop and how long to sleep in each step, the same on every rank: with
    `--duration-s`, decided on the slowest rank's elapsed time (one 1-element all_reduce per
    step), else `--steps` steps and no sleep."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.started = time.perf_counter()
        self.normal_step_s: float | None = None

    def sleep_s(self, step: int, times: list[float]) -> float | None:
        """Seconds to sleep inside `step`, or None when the run is over."""
        args = self.args
        if args.duration_s is None:
            return 0.0 if step < args.steps else None
        elapsed = torch.tensor([time.perf_counter() - self.started], dtype=torch.float64)
        dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
        elapsed_s = float(elapsed.item())
        if elapsed_s >= args.duration_s:
            return None
        if args.slow_after_s is None or elapsed_s < args.slow_after_s or len(times) < 2:
            return 0.0
        if self.normal_step_s is None:  # this rank's own pace before the slowdown
            self.normal_step_s = statistics.median(times[1:])
        return (args.slow_factor - 1) * self.normal_step_s


def _burning_analyse(burn_s: float) -> Any:
    """The engine's analysis (CPU device, no link facts) after `burn_s` s of busy CPU time;
    None (the agent's own analysis) when there is nothing to burn."""
    if burn_s <= 0:
        return None

    def analyse(path: str) -> Any:
        from mfuscope.core.trace import analyze_trace, read_trace
        from mfuscope.core.trace.options import analysis_options

        until = time.thread_time() + burn_s
        while time.thread_time() < until:
            pass
        return analyze_trace(read_trace(path), analysis_options(device=None)).steps

    return analyse


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
    # Imported here: benchmarks/agent_overhead.py loads this file for its model alone, without
    # the repository on its path.
    from tests.support import job_exit

    job_exit.freeze_at_exit()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
