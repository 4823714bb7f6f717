"""The agent's cost on the training thread in one process (world size 1), against the floor.

    .venv/bin/python benchmarks/agent_overhead_single.py [--rounds 200] [--block 20]

A small model (two 64-wide linear layers, batch 8, SGD; OMP_NUM_THREADS=1) trains in one
process without torch.distributed, one copy per mode (each agent's forward hook sees only its own
model: a marked step stays open while the other modes' blocks run). Blocks of steps of these
modes are interleaved in a rotating order every round, so drift hits all modes alike:

- `baseline`: the plain step;
- `floor`: the step inside a trivial context manager that takes one timestamp and appends it to
  a list (the least any per-step instrumentation can cost);
- `always-on`: `with agent.step():` of an agent with profiling off (FLOPs counted once from the
  model, reports to a JSONL file);
- `no-clock`: the same with `thread_clock=False` (the hot path without the thread clock's
  read, as on GPU timelines less their CUDA event);
- `marker`, `marker-no-clock`: the same two agents' paths through `agent.mark_step()` at the
  top of each step instead of a `with` block (agents of their own);
- `device-fake`, `device-fake-mark`: the GPU hot path (`with agent.step():`, then
  `agent.mark_step()`) with the CUDA calls replaced by C builtins of the same shape (`record`:
  `operator.is_(event, stream)`, the stream handle: a constant's `__next__`), so it counts the
  path's own Python work on this CPU, not the driver's time to enqueue an event (a real GPU's
  figures come from `mfuscope validate-gpu`); `floor-device-fake`: the device floor
  (`hot_path_probe.DeviceFloor`: the floor plus one event record per boundary) on the same
  fakes, the floor validate-gpu holds the device path to;
- `default`: an agent with its default sampling (a profiled window at its step 10 and then at
  the default cadence).

Printed per mode: the time spent inside the instrumentation per step (entering and leaving
`agent.step()` or the floor's context manager, or the one `mark_step()` call), median and p99,
and the median's ratio to the floor's; and the median step time. Each agent takes three steps
before the timed rounds (its first step counts FLOPs), in its own mode.
"""

from __future__ import annotations

import argparse
import copy
import itertools
import operator
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from _floor import IN_AGENT_HEADER, Floor, in_agent_columns

MODES = (
    "baseline",
    "floor",
    "always-on",
    "no-clock",
    "marker",
    "marker-no-clock",
    "floor-device-fake",
    "device-fake",
    "device-fake-mark",
    "default",
)
MARKING = {"marker", "marker-no-clock", "device-fake-mark"}
FLOORS = {"floor", "floor-device-fake"}


class _PassedEvent:
    """A device event the fake device has always passed (its period: 0.05 ms)."""

    __slots__ = ()

    def query(self) -> bool:
        return True

    def elapsed_time(self, end_event: object) -> float:
        return 0.05


def _fake_calls() -> Any:
    """The CUDA calls of a step boundary as C builtins of the same shape."""
    from mfuscope.agent.step_timer import DeviceCalls

    return DeviceCalls(
        new_event=_PassedEvent,
        record=operator.is_,
        raw_stream=itertools.repeat(0).__next__,
        stream=object,
    )


def _device_fake_agent(options: dict[str, Any]) -> Any:
    """An agent on the device path whose CUDA calls are `_fake_calls`."""
    from mfuscope.agent._agent import Seams, agent_with_seams
    from mfuscope.agent.step_timer import DeviceEventStepTimer

    timer = DeviceEventStepTimer(_fake_calls())
    return agent_with_seams(Seams(timer=timer), profile=False, **options)


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
    first = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 64))
    models = {mode: copy.deepcopy(first) for mode in MODES}
    inputs = torch.randn(8, 64)

    def trainer(model: nn.Module) -> Any:
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01)

        def train_step() -> None:
            optimizer.zero_grad(set_to_none=True)
            model(inputs).sum().backward()
            optimizer.step()

        return train_step

    trains = {mode: trainer(model) for mode, model in models.items()}
    out = Path(tempfile.mkdtemp(prefix="mfuscope-bench-"))

    def common(mode: str) -> dict[str, Any]:
        return {
            "job": "bench",
            "model": models[mode],
            "peak_flops": 1e12,
            "jsonl_path": str(out / f"{mode}.jsonl"),
        }

    agents = {
        "always-on": Agent(profile=False, **common("always-on")),
        "no-clock": Agent(profile=False, thread_clock=False, **common("no-clock")),
        "marker": Agent(profile=False, **common("marker")),
        "marker-no-clock": Agent(profile=False, thread_clock=False, **common("marker-no-clock")),
        "device-fake": _device_fake_agent(common("device-fake")),
        "device-fake-mark": _device_fake_agent(common("device-fake-mark")),
        "default": Agent(**common("default")),
    }
    from mfuscope.agent.hot_path_probe import DeviceFloor

    scopes: dict[str, Any] = {
        "floor": Floor(),
        "floor-device-fake": DeviceFloor(_fake_calls()),
        **agents,
    }
    for train in trains.values():
        for _ in range(50):
            train()
    for mode, agent in agents.items():  # the first steps (FLOP counting) before the rounds
        for _ in range(3):
            if mode in MARKING:
                agent.mark_step()
                trains[mode]()
            else:
                with agent.step():
                    trains[mode]()
    inside: dict[str, list[float]] = {mode: [] for mode in MODES}
    steps: dict[str, list[float]] = {mode: [] for mode in MODES}
    clock = time.perf_counter
    started = clock()
    for round_index in range(args.rounds):
        order = MODES[round_index % len(MODES) :] + MODES[: round_index % len(MODES)]
        for mode in order:
            scope = scopes.get(mode)
            train_step = trains[mode]
            for _ in range(args.block):
                if scope is None:
                    t0 = clock()
                    train_step()
                    t1 = t2 = t3 = clock()
                elif mode in MARKING:
                    t0 = clock()
                    scope.mark_step()
                    t1 = t2 = clock()
                    train_step()
                    t3 = clock()
                    inside[mode].append(t1 - t0)
                    steps[mode].append(t3 - t0)
                    continue
                else:
                    t0 = clock()
                    with scope if mode in FLOORS else scope.step():
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
    floor_median = statistics.median(inside["floor"])
    print(
        f"agent overhead, world size 1: 2 x Linear(64, 64), batch 8, {args.rounds} rounds x "
        f"{args.block} steps per mode, {elapsed:.0f} s"
    )
    print(f"{'mode':<16} {'steps':>6} {'step us':>8}   {IN_AGENT_HEADER}")
    for mode in MODES:
        line = f"{mode:<16} {len(steps[mode]):>6} {statistics.median(steps[mode]) * 1e6:>8.1f}"
        if mode != "baseline":
            line += "   " + in_agent_columns(inside[mode], floor_median)
        print(line)
    device_floor = statistics.median(inside["floor-device-fake"])
    print(
        "device path on fake CUDA calls, median / the device floor's (fakes): with-step "
        f"{statistics.median(inside['device-fake']) / device_floor:.2f}, marker "
        f"{statistics.median(inside['device-fake-mark']) / device_floor:.2f}"
    )
    switches = list(getattr(windows.get("default"), "switch_costs_s", ()))
    if switches:
        print(
            "default agent's profiled windows: training-thread time to start + stop the "
            "profiler, per window: " + ", ".join(f"{s * 1e3:.1f} ms" for s in switches)
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
