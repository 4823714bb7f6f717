"""Agent overhead on the 2-rank gloo training job of the agent tests, with and without the agent.

    .venv/bin/python benchmarks/agent_overhead.py [--rounds 50] [--block 10]

Launches itself under `torchrun --standalone --nproc_per_node=2` (OMP_NUM_THREADS=1). In one
process run it interleaves blocks of steps of five modes, in a rotating order every round so
drift (other load on the machine, warm-up) hits all modes alike:

- `baseline`: the plain training step;
- `floor`: the step inside a trivial context manager that takes one timestamp and appends it to
  a list: the least any per-step instrumentation can cost on this machine, right after a DDP step;
- `records-off`: the agent with profiling off and its flight-recorder reader off (step timing,
  FLOPs, reports to a JSONL file);
- `always-on`: the agent with profiling off and the flight recorder read on the agent's reader
  thread (its default; ``collective_records``);
- `default`: the agent with its default sampling (profiled windows analysed off-thread) and the
  recorder read.

Each agent's reader thread reads only during its own mode's blocks (the others are paused), so a
mode's step times include its own reader's GIL use and nobody else's.

The model is `tests/support/agent_job.py`'s: the packaged demo GPT (`mfuscope.cli.demo.job`;
DDP, every other block checkpointed).
Step times are rank 0's `perf_counter` around the whole step (the `with agent.step()` block
included). The first table gives, per mode, the median step time and its ratio to the baseline,
and the time spent inside the instrumentation per step (entering and leaving `agent.step()`, or
the floor's context manager): median, p99 and the median's ratio to the floor's. That is the
direct measure of what the training thread pays, independent of step-to-step noise. Each agent's
first step (FlopCounterMode counting, once per run) is left out of the figures. Then: the default
agent's profiled windows (the training thread's time to start and stop the profiler on the steps
that take a window, the measured window cost and the amortised ratio at the default cadence), the
mean ratios, per-round ratios (each block against the adjacent baseline block) and the
flight-recorder reader's figures. The world-size-1 figure comes from
`benchmarks/agent_overhead_single.py`.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from types import ModuleType
from typing import Any

from _floor import IN_AGENT_HEADER, Floor, in_agent_columns, quantile

ROOT = Path(__file__).resolve().parents[1]
MODES = ("baseline", "floor", "records-off", "always-on", "default")
AGENT_MODES = ("records-off", "always-on", "default")


def _job_module() -> ModuleType:
    path = ROOT / "tests" / "support" / "agent_job.py"
    spec = importlib.util.spec_from_file_location("agent_job", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _launch(argv: list[str]) -> int:
    import subprocess

    torchrun = Path(sys.executable).parent / "torchrun"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MFUSCOPE_BENCH_WORKER": "1"}
    command = [str(torchrun), "--standalone", "--nproc_per_node=2", __file__, *argv]
    return subprocess.run(command, env=env).returncode


def _worker(args: argparse.Namespace) -> None:
    import torch.distributed as dist
    from mfuscope.agent import Agent

    job = _job_module()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    model, optimizer = job.build()
    out = Path(tempfile.mkdtemp(prefix="mfuscope-bench-"))
    common = {"job": "bench", "model": model, "jsonl_path": str(out / "r{rank}.jsonl")}
    agents = {
        "records-off": Agent(profile=False, collective_records=False, **common),
        "always-on": Agent(profile=False, **common),
        "default": Agent(**common),
    }
    scopes: dict[str, Any] = {"floor": Floor(), **agents}
    readers = {
        mode: runtime.collectives
        for mode, agent in agents.items()
        if (runtime := agent._runtime) is not None and runtime.collectives is not None
    }
    for step in range(args.warmup):
        job.train_step(model, optimizer, step)
    times: dict[str, list[float]] = {mode: [] for mode in MODES}
    inside: dict[str, list[float]] = {mode: [] for mode in MODES}  # time in instrumentation
    rounds: dict[str, list[float]] = {mode: [] for mode in MODES}  # per-round block medians
    started = time.perf_counter()
    step = args.warmup
    for round_index in range(args.rounds):
        order = MODES[round_index % len(MODES) :] + MODES[: round_index % len(MODES)]
        for mode in order:
            scope = scopes.get(mode)
            for reader_mode, reader in readers.items():
                (reader.resume if reader_mode == mode else reader.pause)()
            block = []
            for _ in range(args.block):
                if scope is None:
                    t0 = time.perf_counter()
                    job.train_step(model, optimizer, step)
                    t1 = t2 = t3 = time.perf_counter()
                else:
                    t0 = time.perf_counter()
                    with scope if mode == "floor" else scope.step():
                        t1 = time.perf_counter()
                        job.train_step(model, optimizer, step)
                        t2 = time.perf_counter()
                    t3 = time.perf_counter()
                times[mode].append(t3 - t0)
                inside[mode].append((t1 - t0) + (t3 - t2))
                block.append(t3 - t0)
                step += 1
            rounds[mode].append(statistics.median(block))
    elapsed = time.perf_counter() - started
    for reader in readers.values():
        reader.resume()
    reader_stats = {
        mode: (
            reader.reads,
            reader.cpu_s,
            reader.taken,
            reader.records().lost_total,
            reader.longest_hold_s,
        )
        for mode, reader in readers.items()
    }
    default_runtime = agents["default"]._runtime
    windows = default_runtime.windows if default_runtime else None
    for agent in agents.values():
        agent.close()
    health = agents["default"].health.snapshot()
    dist.barrier()
    if rank == 0:
        for mode in AGENT_MODES:  # the agents' first step counts FLOPs (once per run): apart
            times[mode], inside[mode] = times[mode][1:], inside[mode][1:]
        _print_inside(args, times, inside, elapsed)
        ratio = agents["default"].config.profile_max_overhead_ratio
        _print_windows(times, health, windows, ratio)
        _print_paired(times, rounds)
        _print_recorder(times, inside, rounds, reader_stats, elapsed)
    dist.destroy_process_group()


def _print_inside(
    args: argparse.Namespace,
    times: dict[str, list[float]],
    inside: dict[str, list[float]],
    elapsed: float,
) -> None:
    """Per mode: step time (median, ratio to the baseline) and time inside the instrumentation
    (median, p99, ratio of the median to the floor's)."""
    base_median = statistics.median(times["baseline"])
    floor_median = statistics.median(inside["floor"])
    print(
        f"agent overhead: 2-rank gloo DDP demo GPT, {args.rounds} rounds x {args.block} steps "
        f"per mode, {elapsed:.0f} s"
    )
    print(f"{'mode':<12} {'steps':>5} {'step ms':>8} {'/base':>7}   {IN_AGENT_HEADER}")
    for mode in MODES:
        steps = times[mode]
        line = (
            f"{mode:<12} {len(steps):>5} {statistics.median(steps) * 1e3:>8.2f} "
            f"{statistics.median(steps) / base_median:>7.4f}"
        )
        if mode != "baseline":
            line += "   " + in_agent_columns(inside[mode], floor_median)
        print(line)
    print(json.dumps({mode: statistics.median(v) for mode, v in inside.items() if v}))


def _print_windows(
    times: dict[str, list[float]], health: object, windows: Any, budget_ratio: float
) -> None:
    """The default agent's windows: what starting and stopping the profiler cost the training
    thread on the steps that took a window, the measured cost, and the amortised ratio."""
    print(f"default agent health: {health}")
    if windows is None:
        return
    switches = getattr(windows, "switch_costs_s", ())
    if switches:
        print(
            "profiled windows: training-thread time to start + stop the profiler, per window: "
            + ", ".join(f"{s * 1e3:.1f} ms" for s in switches)
        )
    cost = getattr(windows, "last_cost_s", None)
    if cost is None:
        return
    step_s = statistics.median(times["baseline"])
    # Default cadence: every 1000 steps or 300 s (whichever first), but never sooner than
    # cost / profile_max_overhead_ratio after the previous window (the agent's budget rule).
    interval_s = max(min(1000 * step_s, 300.0), cost / budget_ratio)
    print(f"last profiled window cost (extra step time + analysis CPU time): {cost:.3f} s")
    print(
        f"default cadence here: a window every {interval_s:.0f} s -> amortised "
        f"ratio {1 + cost / interval_s:.4f} (budget {1 + budget_ratio:.4f}; projection from the "
        "measured cost)"
    )


def _print_paired(times: dict[str, list[float]], rounds: dict[str, list[float]]) -> None:
    """Mean step-time ratios over the run (the default agent's window amortised over this short
    run only) and per-round ratios (each mode's block median / the same round's baseline block
    median, blocks adjacent in time)."""
    base = rounds["baseline"]
    base_mean = statistics.fmean(times["baseline"])
    for mode in MODES[1:]:
        ratios = [m / b for m, b in zip(rounds[mode], base, strict=True)]
        print(
            f"{mode:<12} mean step ratio {statistics.fmean(times[mode]) / base_mean:.4f}; "
            f"per-round ratio median {statistics.median(ratios):.4f} "
            f"[p25 {quantile(ratios, 0.25):.4f}, p75 {quantile(ratios, 0.75):.4f}]"
        )


def _print_recorder(
    times: dict[str, list[float]],
    inside: dict[str, list[float]],
    rounds: dict[str, list[float]],
    reader_stats: dict[str, tuple[int, float, int, int, float]],
    elapsed: float,
) -> None:
    """The flight-recorder read against the same agent with the recorder off: step time median
    and p99, time in agent code on the training thread (median and p99), and the reader
    thread's CPU time (it read only during its own mode's blocks)."""
    off = times["records-off"]
    print("flight-recorder read (always-on) against the recorder off (records-off):")
    for mode in AGENT_MODES:
        steps, agent_s = times[mode], inside[mode]
        print(
            f"  {mode:<11} step median {statistics.median(steps) * 1e3:.2f} ms "
            f"(x{statistics.median(steps) / statistics.median(off):.4f}), "
            f"p99 {quantile(steps, 0.99) * 1e3:.2f} ms "
            f"(x{quantile(steps, 0.99) / quantile(off, 0.99):.4f}); in agent code median "
            f"{statistics.median(agent_s) * 1e6:.0f} us, "
            f"p99 {quantile(agent_s, 0.99) * 1e6:.0f} us"
        )
    paired = [a / b for a, b in zip(rounds["always-on"], rounds["records-off"], strict=True)]
    print(
        f"  always-on / records-off per round: median {statistics.median(paired):.4f} "
        f"[p25 {quantile(paired, 0.25):.4f}, p75 {quantile(paired, 0.75):.4f}]"
    )
    for mode, (reads, cpu_s, taken, lost, hold_s) in reader_stats.items():
        active_s = elapsed / len(MODES)
        print(
            f"  reader of {mode}: {reads} reads, {taken} entries taken, {lost} lost, "
            f"CPU {cpu_s:.3f} s = {cpu_s / active_s:.4f} of one core while it read; longest "
            f"stretch holding the GIL {hold_s * 1e3:.2f} ms"
        )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=50)
    parser.add_argument("--block", type=int, default=10, help="steps per mode per round")
    parser.add_argument("--warmup", type=int, default=10)
    args = parser.parse_args()
    if os.environ.get("MFUSCOPE_BENCH_WORKER") != "1":
        return _launch(sys.argv[1:])
    _worker(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
