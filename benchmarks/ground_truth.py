"""The agent's step breakdown against ground truth: a 2-rank gloo job that times its own phases.

    .venv/bin/python benchmarks/ground_truth.py [--runs 3] [--steps 300] [--every 60] [--window 3]
        [--busy N] [--keep DIR]

Runs `tests/support/ground_truth_job.py` on 2 ranks started by `tests/support/launch.py`
(torchrun's environment for each rank, OMP_NUM_THREADS=1, without a torchrun process): each step 12
x (matmul + tanh) on 256 x 256, a blocking all_reduce of 1 MiB and a sleep of 4 ms (rank 0) or 2 ms
(rank 1), each timed with `perf_counter` by the script, with the agent profiling `--window` steps
every `--every` steps and keeping every window's trace.

Per run and rank, in points (percent of a step) of exposed communication minus the time the script
spent in the all_reduce until its work completed:

- profiled steps: `mfuscope analyze`'s engine on the kept traces, and the agent's own reports of
  the same steps (worst step, mean);
- carried steps (every step between windows) over their time (what a dashboard's ratio of
  counters shows): *share*, the window's share of exposed communication scaled to each step
  (how steps carried it until they took it from their own blocked time), *before*, what the
  agent's rule before this change would have carried (recomputed from the job's own readings of
  the thread clock, which the agent reads too), and *after*, what the agent carried
  (docs/definitions.md#carried-breakdowns). All from the same run, so the machine's load is the
  same for each. Over the steps whose completion time the script knows, and, after the slash,
  also over those whose call only returned late (the work still in flight when its callback was
  set: their time agrees with the trace within 0.2 points on profiled steps). Under load those
  are a quarter to a half of the steps, the ones where the thread waited for a CPU inside the
  collective's call: left out, they favour a rule that carries no such wait;
- the spread between windows the report and the Job dashboard show for the rank.

`--busy N` runs N busy Python loops beside the job (a loaded machine: on 2 cores, the job's two
ranks and their gloo threads then wait for CPUs). The figures move from run to run; compare before
and after within a run.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _carried import (
    before,
    beside_busy_loops,
    by_reports,
    by_rule,
    load_run,
    share,
    truth_parser,
    window_options,
    worst_and_mean,
)
from mfuscope.core.run_summary.coverage import rank_coverage

from tests.support import ground_truth


def main() -> None:
    parser = truth_parser(__doc__.split("\n\n")[0])
    args = parser.parse_args()
    beside_busy_loops(args.busy, lambda: _measure(args))


def _measure(args: argparse.Namespace) -> None:
    options = window_options(args.window, args.every)
    print(
        "run rank windows carried | profiled steps: worst/mean analyze, agent | "
        "carried by time (known/with late calls): share, before, after | spread"
    )
    scores: dict[str, list[float]] = {"before": [], "after": [], "share": []}
    for n in range(args.runs):
        with tempfile.TemporaryDirectory() as workdir:
            run, done = ground_truth.run(Path(workdir), args.steps, *options, timeout_s=600)
            if done.returncode != 0:
                sys.exit(done.stderr[-3000:])
            for rank in (0, 1):
                known, late = (
                    load_run(Path(workdir), rank, relaxed=False),
                    load_run(Path(workdir), rank),
                )
                assert known is not None and late is not None
                by = {
                    "share": [by_rule(r, share).by_time for r in (known, late)],
                    "before": [by_rule(r, before).by_time for r in (known, late)],
                    "after": [by_reports(r).by_time for r in (known, late)],
                }
                for name, (_, relaxed) in by.items():
                    scores[name].append(abs(relaxed))
                coverage = rank_coverage(rank, list(run.reports(rank).values()))
                spread = coverage.exposed_spread
                print(
                    f"{n:3d} {rank:4d} {coverage.windows:7d} {len(late.carried):7d} | "
                    f"{worst_and_mean(ground_truth.trace_errors(run, rank))}, "
                    f"{worst_and_mean(ground_truth.report_errors(run, rank, late=False).window)} | "
                    + ", ".join(f"{a:+5.1f}/{b:+5.1f}" for a, b in by.values())
                    + " | "
                    + ("-" if spread is None else f"{100 * spread:.1f}"),
                    flush=True,
                )
            if args.keep:
                shutil.copytree(
                    workdir,
                    Path(args.keep) / f"allreduce-{n}",
                    ignore=shutil.ignore_patterns("tmp"),
                )
    print("carried by time with late calls, mean |error| over runs and ranks (rank-runs within 4):")
    for name, values in scores.items():
        print(
            f"  {name}: {statistics.fmean(values):.1f} points ({sum(e <= 4 for e in values)} of "
            f"{len(values)}), largest {max(values):.1f}"
        )


if __name__ == "__main__":
    main()
