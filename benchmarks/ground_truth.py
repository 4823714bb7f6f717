"""The agent's step breakdown against ground truth: a 2-rank gloo job that times its own phases.

    .venv/bin/python benchmarks/ground_truth.py [--runs 3] [--steps 300] [--every 60] [--window 3]
        [--busy N]

Runs `tests/support/ground_truth_job.py` under `torchrun --standalone --nproc_per_node=2`
(OMP_NUM_THREADS=1): each step 12 x (matmul + tanh) on 256 x 256, a blocking all_reduce of 1 MiB
and a sleep of 4 ms (rank 0) or 2 ms (rank 1), each timed with `perf_counter` by the script, with
the agent profiling `--window` steps every `--every` steps and keeping every window's trace.

Per run and rank, in points (percent of a step) of exposed communication minus the time the script
spent in the all_reduce until its work completed:

- profiled steps: `mfuscope analyze`'s engine on the kept traces, and the agent's own reports of
  the same steps (worst step, mean);
- carried steps (every step between windows), averaged per step and over their time (what a
  dashboard's ratio of counters shows): *before*, the window's share of exposed communication
  scaled to each step (its steps but the first, by time: how steps carried it until they took
  it from their own blocked time; recomputed from the same run's window reports), and *after*,
  what the agent carried (each step's blocked time less the blocked time elsewhere, see
  docs/definitions.md#carried-breakdowns). Before and after come from the same run, so the
  machine's load is the same for both;
- the spread between windows the report and the Job dashboard show for the rank.

`--busy N` runs N busy Python loops beside the job (a loaded machine: on 2 cores, the job's two
ranks and their gloo threads then wait for CPUs). The figures move from run to run; compare before
and after within a run.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from mfuscope.core.run_summary.coverage import rank_coverage
from mfuscope.core.run_summary.window_spread import window_exposed_share

from tests.support import ground_truth


def _worst(errors: dict[int, float]) -> str:
    if not errors:
        return "-"
    worst = max(errors.values(), key=abs)
    return f"{worst:+6.1f} / {statistics.fmean(errors.values()):+5.1f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--every", type=int, default=60)
    parser.add_argument("--window", type=int, default=3)
    parser.add_argument("--busy", type=int, default=0, help="busy loops beside the job")
    args = parser.parse_args()
    busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(args.busy)]
    try:
        _measure(args)
    finally:
        for loop in busy:
            loop.kill()
            loop.wait()


def _measure(args: argparse.Namespace) -> None:
    options = (
        "profile_first_step=10",
        f"profile_steps={args.window}",
        f"profile_every_steps={args.every}",
        "profile_max_overhead_ratio=1",
        "profile_every_s=100000",
    )
    print(
        "run rank windows carried | profiled steps: worst/mean analyze, agent | "
        "carried per step: before, after | carried by time: before, after | spread"
    )
    after_abs: list[float] = []
    before_abs: list[float] = []
    for n in range(args.runs):
        with tempfile.TemporaryDirectory() as workdir:
            run, done = ground_truth.run(Path(workdir), args.steps, *options, timeout_s=600)
            if done.returncode != 0:
                sys.exit(done.stderr[-3000:])
            for rank in (0, 1):
                after = ground_truth.report_errors(run, rank)
                before = ground_truth.report_errors_with(run, rank, window_exposed_share)
                coverage = rank_coverage(rank, list(run.reports(rank).values()))
                spread = coverage.exposed_spread
                after_abs.append(abs(after.carried_time_weighted))
                before_abs.append(abs(before.carried_time_weighted))
                print(
                    f"{n:3d} {rank:4d} {coverage.windows:7d} {len(after.carried):7d} | "
                    f"{_worst(ground_truth.trace_errors(run, rank))}, {_worst(after.window)} | "
                    f"{before.carried_mean:+6.1f}, {after.carried_mean:+6.1f} | "
                    f"{before.carried_time_weighted:+6.1f}, {after.carried_time_weighted:+6.1f} | "
                    + ("-" if spread is None else f"{100 * spread:.1f}"),
                    flush=True,
                )
    before_mean, after_mean = statistics.fmean(before_abs), statistics.fmean(after_abs)
    print(
        f"carried by time, mean |error| over runs and ranks: before {before_mean:.1f}, after "
        f"{after_mean:.1f} points (after/before {after_mean / max(before_mean, 1e-9):.2f}); "
        f"rank-runs within 4 points: before {sum(e <= 4 for e in before_abs)}, after "
        f"{sum(e <= 4 for e in after_abs)} of {len(after_abs)}; largest: before "
        f"{max(before_abs):.1f}, after {max(after_abs):.1f}"
    )


if __name__ == "__main__":
    main()
