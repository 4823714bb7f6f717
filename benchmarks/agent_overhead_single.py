"""The agent's cost on the training thread in one process (world size 1), against the floor.

    .venv/bin/python benchmarks/agent_overhead_single.py [--rounds 200] [--block 20]

A small model (two 64-wide linear layers, batch 8, SGD; OMP_NUM_THREADS=1) trains in one
process without torch.distributed. Blocks of steps of five modes are interleaved in a rotating
order every round, so drift hits all modes alike:

- `baseline`: the plain step;
- `floor`: the step inside a trivial context manager that takes one timestamp and appends it to
  a list (the least any per-step instrumentation can cost);
- `always-on`: `with agent.step():` of an agent with profiling off (FLOPs counted once from the
  model, reports to a JSONL file);
- `no-clock`: the same with `thread_clock=False` (the hot path without the thread clock's
  read, as on GPU timelines less their CUDA event);
- `default`: an agent with its default sampling (a profiled window at its step 10 and then at
  the default cadence).

Printed per mode: the time spent inside the instrumentation per step (entering and leaving
`agent.step()`, or the floor's context manager), median and p99, and the median's ratio to the
floor's; and the median step time. Each agent's first step (FLOP counting) is left out.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from _floor import IN_AGENT_HEADER, Floor, in_agent_columns

MODES = ("baseline", "floor", "always-on", "no-clock", "default")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=200)
    parser.add_argument("--block", type=int, default=20, help="steps per mode per round")
    args = parser.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import torch
    from mfuscope.agent import Agent
    from torch import nn

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 64))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    inputs = torch.randn(8, 64)

    def train_step() -> None:
        optimizer.zero_grad(set_to_none=True)
        model(inputs).sum().backward()
        optimizer.step()

    out = Path(tempfile.mkdtemp(prefix="mfuscope-bench-"))
    common: dict[str, Any] = {"job": "bench", "model": model, "peak_flops": 1e12}
    agents = {
        "always-on": Agent(profile=False, jsonl_path=str(out / "on.jsonl"), **common),
        "no-clock": Agent(
            profile=False, thread_clock=False, jsonl_path=str(out / "off.jsonl"), **common
        ),
        "default": Agent(jsonl_path=str(out / "default.jsonl"), **common),
    }
    scopes: dict[str, Any] = {"floor": Floor(), **agents}
    for _ in range(50):
        train_step()
    inside: dict[str, list[float]] = {mode: [] for mode in MODES}
    steps: dict[str, list[float]] = {mode: [] for mode in MODES}
    clock = time.perf_counter
    started = clock()
    for round_index in range(args.rounds):
        order = MODES[round_index % len(MODES) :] + MODES[: round_index % len(MODES)]
        for mode in order:
            scope = scopes.get(mode)
            for _ in range(args.block):
                if scope is None:
                    t0 = clock()
                    train_step()
                    t1 = t2 = t3 = clock()
                else:
                    t0 = clock()
                    with scope if mode == "floor" else scope.step():
                        t1 = clock()
                        train_step()
                        t2 = clock()
                    t3 = clock()
                inside[mode].append((t1 - t0) + (t3 - t2))
                steps[mode].append(t3 - t0)
    elapsed = clock() - started
    windows = {mode: agent._runtime.windows for mode, agent in agents.items() if agent._runtime}
    for agent in agents.values():
        agent.close()
    for mode in agents:  # the first step counts FLOPs (once per run): apart
        inside[mode], steps[mode] = inside[mode][1:], steps[mode][1:]
    floor_median = statistics.median(inside["floor"])
    print(
        f"agent overhead, world size 1: 2 x Linear(64, 64), batch 8, {args.rounds} rounds x "
        f"{args.block} steps per mode, {elapsed:.0f} s"
    )
    print(f"{'mode':<10} {'steps':>6} {'step us':>8}   {IN_AGENT_HEADER}")
    for mode in MODES:
        line = f"{mode:<10} {len(steps[mode]):>6} {statistics.median(steps[mode]) * 1e6:>8.1f}"
        if mode != "baseline":
            line += "   " + in_agent_columns(inside[mode], floor_median)
        print(line)
    switches = list(getattr(windows.get("default"), "switch_costs_s", ()))
    if switches:
        print(
            "default agent's profiled windows: training-thread time to start + stop the "
            "profiler, per window: " + ", ".join(f"{s * 1e3:.1f} ms" for s in switches)
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
