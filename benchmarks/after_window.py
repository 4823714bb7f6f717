"""Steady step time after a profiled window, against a run that never profiles.

    .venv/bin/python benchmarks/after_window.py [--pairs 6] [--rounds 15] [--block 10]

A host-bound model (a stack of `--layers` 32-wide linear layers with ReLU, batch 8, SGD;
OMP_NUM_THREADS=1) trains in one process (world size 1) under an agent. Each pair is two fresh
processes alive together, `window` (its agent takes one profiled window of 3 steps, no later
one) and `plain` (the same agent with profiling off), which take turns: `--rounds` rounds of
`--block` timed steps each, the order alternating from round to round, one process idle (blocked
on a pipe) while the other steps, so load from elsewhere on the machine hits both alike.

1. `before`: both warmed up (30 steps), the window not yet taken;
2. the window: `window` steps through its window until the analysis is in (the analyser thread
   idle again), then 20 more; `plain` takes the same number of steps;
3. `after`: the same rounds again.

Printed per pair: the median step times after the window and their ratio (window / plain), and
that ratio divided by the same ratio before the window: two processes of the same program differ
by a few percent for reasons of their own (memory layout), which the second ratio cancels, so it
is what the window left behind. Then the medians over the pairs and, from the last pair, what a
window could leave behind: the profiler's state, global module hooks, torch function and
dispatch modes, Python's profile hook, the threads alive, the garbage collector's counts and the
objects it tracks and the resident memory, in both processes.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

WARM_STEPS = 30
WINDOW_STEPS = 3


def _child(mode: str, layers: int, window_step: int) -> None:
    """Warm up, then do as told on stdin: `go N` (N steps; their times as a JSON list on
    stdout), `window` (the window's steps; how many, on stdout), `steps N` (N untimed steps),
    `quit` (what is left behind, as JSON)."""
    import gc
    import threading

    import torch
    from mfuscope.agent import Agent
    from torch import nn

    torch.manual_seed(0)
    stack: list[nn.Module] = []
    for _ in range(layers):
        stack += [nn.Linear(32, 32), nn.ReLU()]
    model = nn.Sequential(*stack)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    inputs = torch.randn(8, 32)
    out = Path(tempfile.mkdtemp(prefix="mfuscope-after-window-"))
    agent = Agent(
        job="after-window",
        model=model,
        peak_flops=1e12,
        jsonl_path=str(out / "r.jsonl"),
        profile=mode == "window",
        profile_first_step=window_step,
        profile_steps=WINDOW_STEPS,
        profile_every_steps=10**9,
        profile_every_s=1e9,
    )

    def step() -> tuple[float, float]:
        """The step's wall time and the training thread's CPU time in it (s)."""
        started, cpu = time.perf_counter(), time.thread_time()
        with agent.step():
            optimizer.zero_grad(set_to_none=True)
            model(inputs).sum().backward()
            optimizer.step()
        return time.perf_counter() - started, time.thread_time() - cpu

    for _ in range(WARM_STEPS):
        step()
    print("ready", flush=True)
    for line in sys.stdin:
        command = line.split()
        if command[0] == "go":
            print(json.dumps([step() for _ in range(int(command[1]))]), flush=True)
        elif command[0] == "steps":
            for _ in range(int(command[1])):
                step()
            print("done", flush=True)
        elif command[0] == "window":
            print(_through_the_window(agent, step), flush=True)
        else:
            break
    hooks = nn.modules.module
    left = {
        "windows_analysed": agent.health.snapshot().windows_analysed_total,
        "profiler_enabled": bool(torch.autograd.profiler._is_profiler_enabled),
        "kineto_enabled": bool(torch._C._autograd._profiler_enabled()),
        "global_module_hooks": len(hooks._global_forward_pre_hooks)
        + len(hooks._global_forward_hooks),
        "torch_function_modes": torch._C._len_torch_function_stack(),
        "dispatch_modes": len(torch.utils._python_dispatch._get_current_dispatch_mode_stack()),
        "sys_profile": sys.getprofile() is not None,
        "threads": sorted(t.name for t in threading.enumerate()),
        "gc_counts": list(gc.get_count()),
        "gc_collections": [s["collections"] for s in gc.get_stats()],
        "gc_objects": len(gc.get_objects()),
        "rss_mb": _rss_mb(),
    }
    print(json.dumps(left), flush=True)
    agent.close()


def _rss_mb() -> float:
    """This process's resident memory now (MB)."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return round(int(line.split()[1]) / 1024, 1)
    return float("nan")


def _through_the_window(agent: Any, step: Any) -> int:
    """Step through the window until its analysis is in, then 20 steps; the steps taken."""
    runtime = agent._runtime
    assert runtime is not None
    taken = 0
    while (
        taken < WINDOW_STEPS + 5
        or runtime.analyser.busy
        or (agent.health.snapshot().windows_analysed_total == 0)
    ):
        step()  # the analysis runs on its thread; the next step's end picks it up
        taken += 1
    for _ in range(20):
        step()
    return taken + 20


class _Process:
    """One child process, stepping when told."""

    def __init__(self, mode: str, layers: int, window_step: int) -> None:
        env = {**os.environ, "OMP_NUM_THREADS": "1", "MFUSCOPE_AFTER_WINDOW_CHILD": mode}
        self.popen = subprocess.Popen(
            [sys.executable, __file__, "--layers", str(layers), "--window-step", str(window_step)],
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        self.times: list[tuple[float, float]] = []  # (wall s, training thread's CPU s)

    def take(self) -> list[tuple[float, float]]:
        """The step times so far, forgotten here."""
        times, self.times = self.times, []
        return times

    def _line(self) -> str:
        assert self.popen.stdout is not None
        line = self.popen.stdout.readline()
        if not line:
            raise RuntimeError(f"child exited with {self.popen.wait()}")
        return line

    def _send(self, text: str) -> None:
        assert self.popen.stdin is not None
        self.popen.stdin.write(text + "\n")
        self.popen.stdin.flush()

    def ready(self) -> None:
        assert self._line().strip() == "ready"

    def block(self, steps: int) -> None:
        self._send(f"go {steps}")
        self.times += json.loads(self._line())

    def window(self) -> int:
        self._send("window")
        return int(self._line())

    def steps(self, count: int) -> None:
        self._send(f"steps {count}")
        assert self._line().strip() == "done"

    def finish(self) -> dict[str, Any]:
        self._send("quit")
        left: dict[str, Any] = json.loads(self._line())
        self.popen.wait(60)
        return left


def _rounds(
    processes: dict[str, _Process], args: argparse.Namespace
) -> dict[str, tuple[float, float]]:
    """`args.rounds` rounds of interleaved blocks; each process's median step time and median
    CPU time of its training thread per step (s)."""
    for round_ in range(args.rounds):
        order = ("window", "plain") if round_ % 2 == 0 else ("plain", "window")
        for mode in order:
            processes[mode].block(args.block)
    medians = {}
    for mode, process in processes.items():
        times = process.take()
        medians[mode] = (
            statistics.median(t[0] for t in times),
            statistics.median(t[1] for t in times),
        )
    return medians


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=6)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--block", type=int, default=10, help="steps per process per round")
    parser.add_argument("--layers", type=int, default=400)
    parser.add_argument("--window-step", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    child = os.environ.get("MFUSCOPE_AFTER_WINDOW_CHILD")
    if child:
        _child(child, args.layers, args.window_step)
        return 0
    window_step = WARM_STEPS + args.rounds * args.block  # the first step after `before`
    print(
        f"after-window step time: {args.layers} x Linear(32, 32) + ReLU, batch 8, world size 1, "
        f"{args.pairs} pairs x {args.rounds} rounds x {args.block} steps per process before and "
        f"after the window, load average {os.getloadavg()[0]:.1f}"
    )
    print(
        "pair   after: window ms   plain ms   window/plain   / before's"
        "   CPU: window/plain   / before's"
    )
    ratios: dict[str, list[float]] = {"wall": [], "wall behind": [], "cpu": [], "cpu behind": []}
    left: dict[str, dict[str, Any]] = {}
    for pair in range(args.pairs):
        processes = {mode: _Process(mode, args.layers, window_step) for mode in ("window", "plain")}
        for process in processes.values():
            process.ready()
        before = _rounds(processes, args)
        processes["plain"].steps(processes["window"].window())
        after = _rounds(processes, args)
        left = {mode: process.finish() for mode, process in processes.items()}
        assert left["window"]["windows_analysed"] == 1, left["window"]
        row = []
        for i, kind in enumerate(("wall", "cpu")):
            ratio = after["window"][i] / after["plain"][i]
            behind = ratio / (before["window"][i] / before["plain"][i])
            ratios[kind].append(ratio)
            ratios[f"{kind} behind"].append(behind)
            row += [ratio, behind]
        print(
            f"{pair:>4}   {after['window'][0] * 1e3:>15.2f}   {after['plain'][0] * 1e3:>8.2f}"
            f"   {row[0]:>12.4f}   {row[1]:>9.4f}   {row[2]:>17.4f}   {row[3]:>9.4f}"
        )
    names = {
        "wall": "step time, window/plain",
        "wall behind": "step time, left behind",
        "cpu": "training-thread CPU, window/plain",
        "cpu behind": "training-thread CPU, left behind",
    }
    for key, values in ratios.items():
        print(
            f"{names[key]:<33} median over the pairs {statistics.median(values):.4f} "
            f"[min {min(values):.4f}, max {max(values):.4f}]"
        )
    for mode in ("window", "plain"):
        print(f"{mode} process, after its timed steps: {json.dumps(left[mode])}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
