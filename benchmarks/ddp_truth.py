"""The agent's carried breakdown against a DDP loop that knows its own exposed communication.

    .venv/bin/python benchmarks/ddp_truth.py [--runs 3] [--steps 300] [--every 60] [--window 3]
        [--batch 2] [--busy N] [--keep DIR]

Runs `tests/support/ddp_truth_job.py` on 2 ranks started by `tests/support/launch.py` (torchrun's
environment for each rank, OMP_NUM_THREADS=1, without a torchrun process): a small GPT under plain
DDP on gloo with 7-8 gradient buckets all-reduced during the backward pass, 2 micro-steps per
optimizer step (the first under `no_sync`), one `agent.step()` per optimizer step, and a 25 ms
stall in the data loader every 7 steps at a different step on each rank. The job's DDP
communication hook times each bucket's launch and completion (`tests/support/ddp_truth.py` says
what that truth counts). The agent profiles `--window` steps every `--every` steps and keeps every
window's trace.

Per run and rank, in points (percent of a step) of exposed communication minus the job's:

- profiled steps: `mfuscope analyze`'s engine on the kept traces, and the agent's own reports of
  the same steps (worst step / mean);
- carried steps (every step between windows) over their time (what a dashboard's ratio of
  counters shows): *before*, what the agent's rule before this change would have carried
  (recomputed from the job's own readings of the thread clock, which the agent reads too), and
  *after*, what the agent carried;
- stalls: how much more the carried steps with a stall were off in communication than the
  other carried steps, as a part of the stall (before, after: 1 reads all of it as
  communication, 0 none), and how much more idle the agent put on them, as a part of the stall
  (after; `tests/support/ddp_truth.py`, `Stalls`).

`--busy N` runs N busy Python loops beside the job. The figures move from run to run; compare
before and after within a run. `--keep DIR` keeps each run's files there (for
`benchmarks/carried_rules.py score`).
"""

from __future__ import annotations

import argparse
import json
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
    truth_parser,
    window_options,
    worst_and_mean,
)

from tests.support import ddp_truth


def main() -> None:
    parser = truth_parser(__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=int, default=2)
    args = parser.parse_args()
    beside_busy_loops(args.busy, lambda: _measure(args))


def _measure(args: argparse.Namespace) -> None:
    options = window_options(args.window, args.every)
    print(
        "run rank windows carried | profiled worst/mean: analyze, agent | carried by time: "
        "before, after | stall read as comm: before, after | stall put in idle"
    )
    before_abs: list[float] = []
    after_abs: list[float] = []
    stalls_before: list[float] = []
    stalls_after: list[float] = []
    for n in range(args.runs):
        workdir = Path(tempfile.mkdtemp(prefix="ddp-truth-"))
        try:
            run, done = ddp_truth.run(
                workdir, args.steps, *options, batch=args.batch, timeout_s=1800
            )
            if done.returncode != 0:
                sys.exit(done.stderr[-3000:])
            for rank in (0, 1):
                recorded = load_run(workdir, rank)
                assert recorded is not None
                old, new = by_rule(recorded, before), by_reports(recorded)
                before_abs.append(abs(old.by_time))
                after_abs.append(abs(new.by_time))
                stalls_before.append(old.stall_comm)
                stalls_after.append(new.stall_comm)
                window = ddp_truth.report_errors(run, rank).window
                print(
                    f"{n:3d} {rank:4d} {len(recorded.windows):7d} {len(recorded.carried):7d} | "
                    f"{worst_and_mean(ddp_truth.trace_errors(run, rank))}, "
                    f"{worst_and_mean(window)} | "
                    f"{old.by_time:+6.1f}, {new.by_time:+6.1f} | "
                    f"{old.stall_comm:+5.2f}, {new.stall_comm:+5.2f} | "
                    f"{ddp_truth.stalls(run, rank).idle_gained:5.2f}",
                    flush=True,
                )
            if args.keep:
                target = Path(args.keep) / f"ddp-{n}"
                shutil.copytree(workdir, target, ignore=shutil.ignore_patterns("tmp"))
                (target / "load.json").write_text(json.dumps({"busy": args.busy}))
        finally:
            shutil.rmtree(workdir, ignore_errors=True)
    print(
        f"carried by time, mean |error| over runs and ranks: before "
        f"{statistics.fmean(before_abs):.1f}, after {statistics.fmean(after_abs):.1f} points; "
        f"rank-runs within 4 points: before {sum(e <= 4 for e in before_abs)}, after "
        f"{sum(e <= 4 for e in after_abs)} of {len(after_abs)}; largest: before "
        f"{max(before_abs):.1f}, after {max(after_abs):.1f}; stall time read as comm: before "
        f"{statistics.fmean(stalls_before):+.2f}, after {statistics.fmean(stalls_after):+.2f}"
    )


if __name__ == "__main__":
    main()
