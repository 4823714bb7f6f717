"""Score rules for the carried exposed communication of CPU steps offline, on recorded rank-runs of
the two ground-truth jobs (docs/definitions.md#carried-breakdowns).

    .venv/bin/python benchmarks/carried_rules.py record DIR [--job ddp|allreduce] [--runs 3]
        [--steps 300] [--every 60] [--busy N]
    .venv/bin/python benchmarks/carried_rules.py score DIR... [--strict] [--verbose]

`record` runs a job (`tests/support/ddp_truth_job.py` or `ground_truth_job.py`) and keeps each
run (the agent's reports, the job's truth with the training thread's clock read at every step's
start and end, the windows' traces) under DIR, with the machine's load average before and after.
`score` recomputes, for every recorded rank-run, what each candidate rule would have carried on
the steps between windows, from the window reports (their exposed communication, idle and
instrumentation) and the job's own readings of the thread clock (the ones the agent reads too,
microseconds apart), and prints each rule's error against the job's truth over the carried steps'
time (what a dashboard's ratio of counters is off by), in points; `agent` is what the agent
carried. `--strict`: the all-reduce job's steps whose call only returned late do not count (see
`tests/support/ground_truth.py`, `KNOWN`).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _carried import (
    Rule,
    Thread,
    WindowStep,
    before,
    by_reports,
    by_rule,
    clamp,
    load,
    share,
)

from tests.support import ddp_truth, ground_truth

WINDOW_OPTIONS = ("profile_max_overhead_ratio=1", "profile_every_s=100000")


# --- candidate rules: the window's steps, a carried step's thread and wall -> its exposed s ----


def _d(w: WindowStep) -> float:
    """A window step's blocked time (less what the agent names) less its exposed comm, bounded
    by its idle time above and minus its run delay below."""
    return min(max(w.thread.blocked_s - w.exposed_s, -w.thread.run_delay_s), w.idle_s)


def median_d(window: Sequence[WindowStep], thread: Thread, wall_s: float) -> float | None:
    """Shipped: blocked less the median of the window's `_d`."""
    return clamp(thread.blocked_s - statistics.median(_d(w) for w in window), wall_s)


def median_d_raw(window: Sequence[WindowStep], thread: Thread, wall_s: float) -> float | None:
    """`median_d` without the agent's named waits (data loader, own profiler)."""
    d = statistics.median(
        min(max(w.thread.raw_blocked_s - w.exposed_s, -w.thread.run_delay_s), w.idle_s)
        for w in window
    )
    return clamp(thread.raw_blocked_s - d, wall_s)


def midpoint(window: Sequence[WindowStep], thread: Thread, wall_s: float) -> float | None:
    """The rule before, but with the agent's named waits left out."""
    values = []
    for w in window:
        b, x = w.thread.blocked_s, w.exposed_s
        low = min(max(b - x, 0.0), w.idle_s)
        high = min(max(b + w.thread.run_delay_s - x, 0.0), w.idle_s)
        values.append((low + high) / 2)
    return clamp(thread.blocked_s - statistics.median(values), wall_s)


def cleanest(window: Sequence[WindowStep], thread: Thread, wall_s: float) -> float | None:
    """Blocked less the largest `_d`: the window step that waited least for a CPU inside its
    communication."""
    return clamp(thread.blocked_s - max(_d(w) for w in window), wall_s)


def mean_d(window: Sequence[WindowStep], thread: Thread, wall_s: float) -> float | None:
    return clamp(thread.blocked_s - statistics.fmean(_d(w) for w in window), wall_s)


def no_first(window: Sequence[WindowStep], thread: Thread, wall_s: float) -> float | None:
    """`median_d` over the window's steps but its first (the profiler's start)."""
    kept = window[1:] or window
    return clamp(thread.blocked_s - statistics.median(_d(w) for w in kept), wall_s)


def blocked(window: Sequence[WindowStep], thread: Thread, wall_s: float) -> float | None:
    """Its blocked time alone."""
    return clamp(thread.blocked_s, wall_s)


def offcpu(window: Sequence[WindowStep], thread: Thread, wall_s: float) -> float | None:
    """Blocked and run delay, less the window's median of the same less exposed comm."""
    d = statistics.median(w.thread.blocked_s + w.thread.run_delay_s - w.exposed_s for w in window)
    return clamp(thread.blocked_s + thread.run_delay_s - d, wall_s)


RULES: dict[str, Rule] = {
    "share": share,
    "before": before,
    "midpoint": midpoint,
    "median_d_raw": median_d_raw,
    "median_d": median_d,
    "mean_d": mean_d,
    "no_first": no_first,
    "cleanest": cleanest,
    "blocked": blocked,
    "offcpu": offcpu,
}


# --- recording and scoring ---------------------------------------------------------------------


def record(args: argparse.Namespace) -> None:
    directory = Path(args.dir)
    directory.mkdir(parents=True, exist_ok=True)
    options = (
        "profile_first_step=10",
        f"profile_steps={args.window}",
        f"profile_every_steps={args.every}",
        *WINDOW_OPTIONS,
    )
    busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(args.busy)]
    try:
        for _ in range(args.runs):
            folder = directory / f"{args.job}-{time.strftime('%H%M%S')}"
            load_before = _load_average()
            if args.job == "ddp":
                _, done = ddp_truth.run(folder, args.steps, *options, timeout_s=1800)
            else:
                _, done = ground_truth.run(folder, args.steps, *options, timeout_s=1800)
            if done.returncode != 0:
                sys.exit(done.stderr[-3000:])
            note = {"busy": args.busy, "load": [load_before, _load_average()]}
            (folder / "load.json").write_text(json.dumps(note))
            print(folder, note, flush=True)
    finally:
        for loop in busy:
            loop.kill()
            loop.wait()


def _load_average() -> float:
    return float(Path("/proc/loadavg").read_text().split()[0])


def score(args: argparse.Namespace) -> None:
    runs = [r for d in args.dirs for r in load(Path(d), relaxed=not args.strict)]
    runs = [r for r in runs if len(r.carried) >= 20]  # a rank whose reports were lost
    print(f"{len(runs)} rank-runs (mean |error| by time, per step; stall s read as comm)")
    scored = {name: [by_rule(r, rule) for r in runs] for name, rule in RULES.items()}
    scored["agent"] = [by_reports(r) for r in runs]
    for name, scores in scored.items():
        absolute = [abs(s.by_time) for s in scores]
        stalls = [s.stall_comm for s in scores if not math.isnan(s.stall_comm)]
        print(
            f"{name:13s} by time {statistics.fmean(absolute):5.2f}  within 4: "
            f"{sum(e <= 4 for e in absolute):3d}/{len(absolute)}  largest {max(absolute):5.1f}  "
            f"per step {statistics.fmean(s.per_step for s in scores):5.1f}"
            + (f"  stalls {statistics.fmean(stalls):+5.2f}" if stalls else "")
        )
        if args.verbose:
            print(
                "   ",
                " ".join(f"{r.name}:{s.by_time:+.1f}" for r, s in zip(runs, scores, strict=True)),
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    rec = sub.add_parser("record")
    rec.add_argument("dir")
    rec.add_argument("--job", choices=("ddp", "allreduce"), default="ddp")
    rec.add_argument("--runs", type=int, default=3)
    rec.add_argument("--steps", type=int, default=300)
    rec.add_argument("--every", type=int, default=60)
    rec.add_argument("--window", type=int, default=3)
    rec.add_argument("--busy", type=int, default=0, help="busy loops beside the job")
    sc = sub.add_parser("score")
    sc.add_argument("dirs", nargs="+")
    sc.add_argument(
        "--strict", action="store_true", help="late-returning calls do not count (as before)"
    )
    sc.add_argument("--verbose", action="store_true")
    args = parser.parse_args()
    record(args) if args.command == "record" else score(args)


if __name__ == "__main__":
    main()
