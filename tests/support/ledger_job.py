"""A training job that times its own phases with the wall clock: the ground truth of the job-time
ledger (tests/integration/test_job_time_ledger.py, benchmarks/job_time_ledger.py) and the jobs of
the MFUScopeJobTimeLost test on a real Prometheus.

Under torchrun (2 gloo ranks) it trains a small MLP with its gradients all-reduced by hand, saves
a checkpoint every `--save-every` steps (`agent.phase("checkpoint_save")`: rank 0 writes it, both
ranks spend `--save-s`), evaluates every `--eval-every` steps (`agent.phase("evaluation")`) and
once after its last step; `--exit-rank` leaves with an error after step `--exit-after`, so its
peer fails in its next collective (or is stopped by torchrun) and the launch ends. A launch with
`--resume` loads the checkpoint (`agent.phase("checkpoint_load")`) and numbers its steps from it.
Without torchrun it runs one process, no collectives, for `--duration-s`.

Each process writes what its own clock saw to ``OUT/truth-<launch>-<rank>.json``: its start
(the kernel's, read from /proc here, not by the agent), every step's and phase's start and end
(``time.time_ns()`` around the agent's context managers) and its end (just before the agent
closes), written at exit, whatever ended the process (an error, SIGTERM).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

from tests.support import job_exit

_T0 = time.time_ns()


def _process_start_ns() -> int:
    """This process's start on the wall clock, from the kernel's clock ticks after boot."""
    with open("/proc/self/stat") as f:
        ticks = int(f.read().rsplit(")", 1)[1].split()[19])
    with open("/proc/uptime") as f:
        uptime_s = float(f.read().split()[0])
    now = time.time_ns()
    return now - round((uptime_s - ticks / os.sysconf("SC_CLK_TCK")) * 1e9)


def _args() -> argparse.Namespace:
    p = argparse.ArgumentParser()
    p.add_argument("--job", required=True)
    p.add_argument("--collector-url", required=True)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--launch", type=int, default=1)
    p.add_argument("--steps", type=int, default=40, help="run up to this step number")
    p.add_argument("--duration-s", type=float, default=0.0, help="single process: run this long")
    p.add_argument("--resume", action="store_true")
    p.add_argument("--exit-rank", type=int, default=-1)
    p.add_argument("--exit-after", type=int, default=-1)
    p.add_argument("--startup-s", type=float, default=1.0)
    p.add_argument("--step-s", type=float, default=0.1)
    p.add_argument("--save-every", type=int, default=10)
    p.add_argument("--save-s", type=float, default=0.3)
    p.add_argument("--load-s", type=float, default=0.3)
    p.add_argument("--eval-every", type=int, default=15)
    p.add_argument("--eval-s", type=float, default=0.2)
    p.add_argument("--flops-per-step", type=float, default=4e9)
    p.add_argument("--peak-flops", type=float, default=1e11)
    return p.parse_args()


class Truth:
    """What this process's own clock saw."""

    def __init__(self, args: argparse.Namespace, rank: int) -> None:
        self.path = args.out / f"truth-{args.launch}-{rank}.json"
        self.doc: dict[str, Any] = {
            "rank": rank,
            "launch": args.launch,
            "process_start_ns": _process_start_ns(),
            "script_start_ns": _T0,
            "steps": [],
            "phases": [],
            "end_ns": None,
        }

    def step(self, n: int, start: int, end: int) -> None:
        self.doc["steps"].append([n, start, end])

    def phase(self, name: str, start: int, end: int) -> None:
        self.doc["phases"].append([name, start, end])

    def write(self) -> None:
        self.path.write_text(json.dumps(self.doc))


def main() -> None:
    job_exit.freeze_at_exit()
    args = _args()
    args.out.mkdir(parents=True, exist_ok=True)
    # SIGTERM (torchrun stopping the survivors of a failed launch) ends the process like an
    # error: the `finally` below writes the truth and closes the agent.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    distributed = "WORLD_SIZE" in os.environ
    rank = int(os.environ.get("RANK", "0"))
    truth = Truth(args, rank)
    import torch
    import torch.distributed as dist
    from mfuscope.agent import Agent

    if distributed:
        dist.init_process_group("gloo")
    time.sleep(args.startup_s)  # building the model, reading data: the job's own startup work
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 64))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    ckpt = args.out / "checkpoint"
    first = int((ckpt / "step.txt").read_text()) if args.resume else 0
    agent = Agent(
        job=args.job,
        collector_url=args.collector_url,
        flops_per_step=args.flops_per_step,
        peak_flops=args.peak_flops,
        first_step=first,
        profile=False,
        calibrate_cpu_peak=False,
        flush_interval_s=0.2,
        jsonl_path=str(args.out / f"agent-{args.launch}-{{rank}}.jsonl"),
    )

    def phase(name: str, seconds: float, work: Any = None) -> None:
        start = time.time_ns()
        try:
            with agent.phase(name):
                if work is not None:
                    work()
                time.sleep(seconds)
        finally:
            truth.phase(name, start, time.time_ns())

    def save() -> None:
        if rank == 0:
            ckpt.mkdir(exist_ok=True)
            torch.save({"model": model.state_dict(), "opt": optimizer.state_dict()}, ckpt / "m.pt")
            (ckpt / "step.txt").write_text(str(n + 1))

    def evaluate() -> None:
        with torch.no_grad():
            model(torch.randn(256, 64)).sum()

    def load() -> None:
        state = torch.load(ckpt / "m.pt")
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["opt"])

    n = first
    try:
        if args.resume:
            phase("checkpoint_load", args.load_s, load)
        deadline = time.monotonic() + args.duration_s
        while n < args.steps if distributed else time.monotonic() < deadline:
            start = time.time_ns()
            try:
                with agent.step():
                    model(torch.randn(32, 64)).pow(2).mean().backward()
                    if distributed:
                        for p in model.parameters():
                            assert p.grad is not None
                            dist.all_reduce(p.grad)
                    optimizer.step()
                    optimizer.zero_grad()
                    time.sleep(args.step_s)
            finally:
                truth.step(n, start, time.time_ns())
            if rank == args.exit_rank and n == args.exit_after and args.launch == 1:
                raise SystemExit(1)  # the rank fails between two steps
            if (n + 1) % args.save_every == 0:
                phase("checkpoint_save", args.save_s, save)
            if (n + 1) % args.eval_every == 0:
                phase("evaluation", args.eval_s, evaluate)
            n += 1
        phase("evaluation", args.eval_s, evaluate)  # after the last step: out of shutdown
    finally:
        truth.doc["end_ns"] = time.time_ns()
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # let the agent flush: it is the end
        agent.close()
        truth.write()


if __name__ == "__main__":
    main()
