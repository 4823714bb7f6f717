"""Agent overhead on the 2-rank gloo training job of the agent tests, with and without the agent.

    .venv/bin/python benchmarks/agent_overhead.py [--rounds 50] [--block 10]

Launches itself under `torchrun --standalone --nproc_per_node=2` (OMP_NUM_THREADS=1). In one
process run it interleaves blocks of steps of four modes, in a rotating order every round so
drift (other load on the machine, warm-up) hits all modes alike:

- `baseline`: the plain training step;
- `records-off`: the agent with profiling off and its flight-recorder reader off (step timing,
  FLOPs, reports to a JSONL file);
- `always-on`: the agent with profiling off and the flight recorder read every second on the
  agent's reader thread (its default; ``collective_records``);
- `default`: the agent with its default sampling (profiled windows analysed off-thread) and the
  recorder read.

Each agent's reader thread reads only during its own mode's blocks (the others are paused), so a
mode's step times include its own reader's GIL use and nobody else's.

The model is `tests/support/agent_job.py`'s: the packaged demo GPT (`mfuscope.agent.examples`;
DDP, every other block checkpointed).
Step times are rank 0's `perf_counter` around the whole step (the `with agent.step()` block
included). Printed: median step time per mode and its ratio to the baseline (targets (a) <= 1.01,
(b) <= 1.02), the mean ratio over the run (which includes the default agent's profiled window
at step 10, amortised over this short run only), the measured cost of the window, and the
amortised ratio that cost implies at the default cadence. Each agent's first step (FlopCounterMode
counting, once per run) is reported apart and left out of the means. Because whole-step ratios
are at the mercy of other load on a shared machine, two more figures follow: per-round ratios
(each block against the adjacent baseline block) with their quartiles, and the time spent
inside agent code per step (entering and leaving `agent.step()`), a direct measure of the
always-on cost on the training thread that does not depend on step-to-step noise.
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

ROOT = Path(__file__).resolve().parents[1]
MODES = ("baseline", "records-off", "always-on", "default")


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
    readers = {
        mode: runtime.collectives
        for mode, agent in agents.items()
        if (runtime := agent._runtime) is not None and runtime.collectives is not None
    }
    for step in range(args.warmup):
        job.train_step(model, optimizer, step)
    times: dict[str, list[float]] = {mode: [] for mode in MODES}
    inside: dict[str, list[float]] = {mode: [] for mode in MODES}  # time in agent code
    rounds: dict[str, list[float]] = {mode: [] for mode in MODES}  # per-round block medians
    started = time.perf_counter()
    step = args.warmup
    for round_index in range(args.rounds):
        order = MODES[round_index % len(MODES) :] + MODES[: round_index % len(MODES)]
        for mode in order:
            agent = agents.get(mode)
            for reader_mode, reader in readers.items():
                (reader.resume if reader_mode == mode else reader.pause)()
            block = []
            for _ in range(args.block):
                t0 = time.perf_counter()
                if agent is None:
                    job.train_step(model, optimizer, step)
                    t1 = t2 = t3 = time.perf_counter()
                else:
                    with agent.step():
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
        _print(args, times, elapsed, health, windows)
        _print_paired(rounds, inside)
        _print_recorder(times, inside, rounds, reader_stats, elapsed)
    dist.destroy_process_group()


def _print(
    args: argparse.Namespace,
    times: dict[str, list[float]],
    elapsed: float,
    health: object,
    windows: object,
) -> None:
    base = times["baseline"]
    base_median, base_mean = statistics.median(base), statistics.fmean(base)
    print(
        f"agent overhead: 2-rank gloo DDP demo GPT, {args.rounds} rounds x {args.block} steps "
        f"per mode, {elapsed:.0f} s"
    )
    print(
        f"{'mode':<10} {'steps':>6} {'median ms':>10} {'ratio':>7} {'mean ms':>9} {'ratio':>7}"
        f"  first step ms"
    )
    for mode in MODES:
        values = times[mode]
        # the agents' first step counts FLOPs under FlopCounterMode (once per run): apart
        first, rest = (values[0], values[1:]) if mode != "baseline" else (None, values)
        median, mean = statistics.median(rest), statistics.fmean(rest)
        print(
            f"{mode:<10} {len(values):>6} {median * 1e3:>10.2f} {median / base_median:>7.4f} "
            f"{mean * 1e3:>9.2f} {mean / base_mean:>7.4f}"
            + (f"  {first * 1e3:.0f}" if first is not None else "")
        )
    print(f"default agent health: {health}")
    cost = getattr(windows, "last_cost_s", None)
    if cost is not None:
        schedule = getattr(windows, "_schedule", None)
        floor_s = schedule.next_earliest_s if schedule is not None else float("nan")
        step_s = statistics.median(base)
        # Default cadence: every 1000 steps or 300 s (whichever first), but never sooner than
        # cost / 0.005 (the agent's own budget rule).
        interval_s = max(min(1000 * step_s, 300.0), floor_s)
        print(f"last profiled window cost (extra step time + analysis CPU time): {cost:.3f} s")
        print(
            f"default cadence here: a window every {interval_s:.0f} s -> amortised "
            f"ratio {1 + cost / interval_s:.4f} (projection from the measured window cost)"
        )
    print(json.dumps({mode: statistics.median(v) for mode, v in times.items()}))


def _quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(int(q * len(ordered)), len(ordered) - 1)]


def _print_paired(rounds: dict[str, list[float]], inside: dict[str, list[float]]) -> None:
    """Per-round ratios (each mode's block median / the same round's baseline block median,
    blocks adjacent in time), and the time spent inside agent code per step."""
    base = rounds["baseline"]
    base_step = statistics.median(base)
    for mode in MODES[1:]:
        ratios = [m / b for m, b in zip(rounds[mode], base, strict=True)]
        agent_s = inside[mode][1:]  # the first step counts FLOPs
        print(
            f"{mode:<10} per-round ratio median {statistics.median(ratios):.4f} "
            f"[p25 {_quantile(ratios, 0.25):.4f}, p75 {_quantile(ratios, 0.75):.4f}]; "
            f"in agent code per step: median {statistics.median(agent_s) * 1e6:.0f} us, "
            f"p99 {_quantile(agent_s, 0.99) * 1e6:.0f} us "
            f"(= {statistics.median(agent_s) / base_step:.5f} of a median step)"
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
    thread's CPU time (it read only during its own mode's blocks, a quarter of the run)."""
    off = times["records-off"][1:]
    print("flight-recorder read (always-on) against the recorder off (records-off):")
    for mode in ("records-off", "always-on", "default"):
        steps, agent_s = times[mode][1:], inside[mode][1:]
        print(
            f"  {mode:<11} step median {statistics.median(steps) * 1e3:.2f} ms "
            f"(x{statistics.median(steps) / statistics.median(off):.4f}), "
            f"p99 {_quantile(steps, 0.99) * 1e3:.2f} ms "
            f"(x{_quantile(steps, 0.99) / _quantile(off, 0.99):.4f}); in agent code median "
            f"{statistics.median(agent_s) * 1e6:.0f} us, "
            f"p99 {_quantile(agent_s, 0.99) * 1e6:.0f} us"
        )
    paired = [a / b for a, b in zip(rounds["always-on"], rounds["records-off"], strict=True)]
    print(
        f"  always-on / records-off per round: median {statistics.median(paired):.4f} "
        f"[p25 {_quantile(paired, 0.25):.4f}, p75 {_quantile(paired, 0.75):.4f}]"
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
