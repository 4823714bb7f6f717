"""Recorded runs of the two ground-truth jobs, step by step, for the carried-breakdown benchmarks
(`ground_truth.py`, `ddp_truth.py`) and the offline scoring of rules (`carried_rules.py`).

A rank-run holds, per step, the training thread's clock as the job itself read it at the step's
start and end (inside `agent.step()`, microseconds from where the agent reads it), the job's truth,
and the agent's reports. From them: what the agent's rule before this change carried (`before`,
recomputed: the agent's reports hold what it carries now, not the thread's times), and what any
candidate rule would carry.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import subprocess
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from mfuscope.core.run_summary.coverage import is_measured
from mfuscope.core.schema import StepReport

from tests.support import ddp_truth, ground_truth

Clock = tuple[int, int, int]  # CPU ns, run delay ns, perf_counter ns


@dataclass(frozen=True)
class Thread:
    """The training thread over one step (s): period, CPU time, run delay, and the blocked time
    the agent can name (waiting in a data loader; on window steps, its profiler's own calls)."""

    period_s: float
    cpu_s: float
    run_delay_s: float
    data_s: float = 0.0
    own_s: float = 0.0

    @property
    def raw_blocked_s(self) -> float:
        """All its blocked time: what the agent read before it named any."""
        return max(self.period_s - self.cpu_s - self.run_delay_s, 0.0)

    @property
    def blocked_s(self) -> float:
        """Its blocked time less what the agent names."""
        return max(self.raw_blocked_s - self.data_s - self.own_s, 0.0)


@dataclass(frozen=True)
class WindowStep:
    """A profiled step: its thread and its decomposition on the trace (s)."""

    thread: Thread
    exposed_s: float
    idle_s: float
    instrumentation_s: float
    wall_s: float


@dataclass(frozen=True)
class Carried:
    """A step between windows: its window (last step), thread, wall s, truth s, stall s."""

    step: int
    window: int
    thread: Thread
    wall_s: float
    truth_s: float
    stall_s: float


@dataclass(frozen=True)
class RankRun:
    """One rank of one recorded run."""

    name: str
    windows: dict[int, list[WindowStep]]  # by the window's last step, in step order
    carried: list[Carried]
    reports: dict[int, StepReport]


Rule = Callable[[Sequence[WindowStep], Thread, float], float | None]


def _blocked(a: Clock, b: Clock) -> float:
    return max((b[2] - a[2]) - (b[0] - a[0]) - max(b[1] - a[1], 0), 0) / 1e9


def threads(starts: dict[int, Clock], data_s: dict[int, float]) -> dict[int, Thread]:
    """Per step, from the clock read at its start and at the next step's start."""
    out = {}
    for step, (cpu, delay, perf) in starts.items():
        following = starts.get(step + 1)
        if following is not None:
            out[step] = Thread(
                (following[2] - perf) / 1e9,
                (following[0] - cpu) / 1e9,
                max(following[1] - delay, 0) / 1e9,
                data_s.get(step, 0.0),
            )
    return out


def own_s(starts: dict[int, Clock], ends: dict[int, Clock], step: int) -> float:
    """The blocked time around `step` outside the job's own code: from the previous step's end
    to this one's start (a window's profiler start) and from its end to the next step's start
    (its stop and export)."""
    total = 0.0
    if step - 1 in ends and step in starts:
        total += _blocked(ends[step - 1], starts[step])
    if step in ends and step + 1 in starts:
        total += _blocked(ends[step], starts[step + 1])
    return total


def rank_run(
    name: str,
    reports: dict[int, StepReport],
    starts: dict[int, Clock],
    ends: dict[int, Clock],
    truth: dict[int, float],
    stall: dict[int, float],
    data_s: dict[int, float],
) -> RankRun:
    clock = threads(starts, data_s)
    measured = sorted(s for s, r in reports.items() if is_measured(r))
    windows: dict[int, list[WindowStep]] = {}
    current: list[WindowStep] = []
    for i, step in enumerate(measured):
        parts: dict[str, float] = {}
        for c in reports[step].components:
            parts[c.component] = parts.get(c.component, 0.0) + c.seconds
        if step in clock:
            thread = clock[step]
            current.append(
                WindowStep(
                    Thread(
                        thread.period_s,
                        thread.cpu_s,
                        thread.run_delay_s,
                        thread.data_s,
                        own_s(starts, ends, step),
                    ),
                    parts.get("exposed_comm", 0.0),
                    parts.get("bubble_idle", 0.0),
                    parts.get("instrumentation", 0.0),
                    reports[step].wall_s,
                )
            )
        if i + 1 == len(measured) or measured[i + 1] != step + 1:
            windows[step], current = current, []
    carried = [
        Carried(s, r.breakdown_step, clock[s], r.wall_s, truth[s], stall.get(s, 0.0))
        for s, r in sorted(reports.items())
        if r.components
        and not is_measured(r)
        and r.breakdown_step is not None
        and windows.get(r.breakdown_step)
        and s in clock
        and s in truth
    ]
    return RankRun(name, windows, carried, reports)


def load_run(folder: Path, rank: int, *, relaxed: bool = True) -> RankRun | None:
    """One recorded rank-run (None when its files are not there). The synchronous all-reduce
    job's steps whose completion time it does not know are left out (`ground_truth.KNOWN`);
    `relaxed=False`: also those where the call only returned late, the work still in flight
    when its callback was set (the job's truth before it told them apart)."""
    truth_path = folder / f"truth-{rank}.json"
    if not truth_path.exists():
        return None
    rows = json.loads(truth_path.read_text())["steps"]
    if isinstance(rows[0], dict):  # the DDP job
        steps = {r["step"]: ddp_truth.step_truth(r) for r in rows}
        starts = {s: _clock(t.start) for s, t in steps.items()}
        ends = {s: _clock(t.end) for s, t in steps.items()}
        truth = {s: t.exposed_s for s, t in steps.items()}
        stall = {s: t.stall_s for s, t in steps.items()}
        data = {r["step"]: float(r.get("data_blocked_s", 0.0)) for r in rows}
        reports = ground_truth.read_reports(str(folder / f"ddp-{rank}.jsonl"))
    else:
        kept = ground_truth.KNOWN if relaxed else (0,)
        starts = {int(r[0]): (int(r[6]), int(r[7]), int(r[8])) for r in rows}
        ends = {int(r[0]): (int(r[9]), int(r[10]), int(r[11])) for r in rows if len(r) > 9}
        truth = {int(r[0]): float(r[2]) for r in rows if int(r[5]) in kept}
        stall, data = {}, {}
        reports = ground_truth.read_reports(str(folder / f"gt-{rank}.jsonl"))
    return rank_run(f"{folder.name}/{rank}", reports, starts, ends, truth, stall, data)


def load(directory: Path, *, relaxed: bool = True) -> list[RankRun]:
    """Every rank-run recorded under `directory` (one folder per run)."""
    runs = []
    for folder in sorted(p for p in directory.iterdir() if p.is_dir()):
        for rank in (0, 1):
            run = load_run(folder, rank, relaxed=relaxed)
            if run is not None:
                runs.append(run)
    return runs


def _clock(c: ddp_truth.Clock) -> Clock:
    return (c.cpu_ns, c.run_delay_ns, c.perf_ns)


def clamp(value: float, wall_s: float) -> float:
    return min(max(value, 0.0), wall_s)


def before(window: Sequence[WindowStep], thread: Thread, wall_s: float) -> float | None:
    """What the agent carried before this change: its whole blocked time (nothing named) less
    the window's median blocked time elsewhere, each step's bounded by 0 and by its idle time,
    the midpoint of that without and with its run delay."""
    values = []
    for w in window:
        b, x = w.thread.raw_blocked_s, w.exposed_s
        low = min(max(b - x, 0.0), w.idle_s)
        high = min(max(b + w.thread.run_delay_s - x, 0.0), w.idle_s)
        values.append((low + high) / 2)
    if not values:
        return None
    return clamp(thread.raw_blocked_s - statistics.median(values), wall_s)


def share(window: Sequence[WindowStep], thread: Thread, wall_s: float) -> float | None:
    """How steps carried their exposed comm before they took it from their own blocked time:
    the window's exposed share (its steps but the first), scaled to the step."""
    kept = window[1:] if len(window) > 1 else window
    measured = math.fsum(w.wall_s - w.instrumentation_s for w in kept)
    return wall_s * math.fsum(w.exposed_s for w in kept) / measured if measured > 0 else None


@dataclass(frozen=True)
class Score:
    """One rule on one rank-run: the error over the carried steps' time and per step (points),
    and the part of the stalls' time it read as communication (the stalled steps' mean error
    less the other steps', over the mean stall)."""

    by_time: float
    per_step: float
    stall_comm: float


def score(run: RankRun, carry: Callable[[Carried], float | None]) -> Score:
    """`carry(step)` (exposed s) against the truth over the rank-run's carried steps."""
    error = wall = 0.0
    per_step = []
    stalls: list[float] = []
    stalled: list[float] = []  # errors (s) on the steps with a stall
    other: list[float] = []
    for c in run.carried:
        carried = carry(c)
        if carried is None:
            continue
        error += carried - c.truth_s
        wall += c.wall_s
        per_step.append(abs(100 * (carried - c.truth_s) / c.wall_s))
        (stalled if c.stall_s > 0 else other).append(carried - c.truth_s)
        if c.stall_s > 0:
            stalls.append(c.stall_s)
    gained = math.nan
    if stalled and other:
        gained = (statistics.fmean(stalled) - statistics.fmean(other)) / statistics.fmean(stalls)
    return Score(
        100 * error / wall if wall else math.nan,
        statistics.fmean(per_step) if per_step else math.nan,
        gained,
    )


def by_rule(run: RankRun, rule: Rule) -> Score:
    return score(run, lambda c: rule(run.windows[c.window], c.thread, c.wall_s))


def by_reports(run: RankRun) -> Score:
    """What the agent carried (its reports)."""
    return score(run, lambda c: _exposed(run.reports[c.step]))


def _exposed(report: StepReport) -> float:
    return math.fsum(c.seconds for c in report.components if c.component == "exposed_comm")


def truth_parser(description: str) -> argparse.ArgumentParser:
    """The options both ground-truth benchmarks take (runs, steps, window schedule, load, keep)."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--every", type=int, default=60)
    parser.add_argument("--window", type=int, default=3)
    parser.add_argument("--busy", type=int, default=0, help="busy loops beside the job")
    parser.add_argument("--keep", help="keep each run's files under this folder")
    return parser


def beside_busy_loops(count: int, measure: Callable[[], None]) -> None:
    """Run `measure` with `count` busy Python loops beside it (a loaded machine), then stop them."""
    busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(count)]
    try:
        measure()
    finally:
        for loop in busy:
            loop.kill()
            loop.wait()


def window_options(window: int, every: int) -> tuple[str, ...]:
    """Agent options for a `window`-step profiling window every `every` steps from step 10, on
    the step schedule alone (no time-based windows, no overhead cap)."""
    return (
        "profile_first_step=10",
        f"profile_steps={window}",
        f"profile_every_steps={every}",
        "profile_max_overhead_ratio=1",
        "profile_every_s=100000",
    )


def worst_and_mean(errors: dict[int, float]) -> str:
    """`worst / mean` of per-step errors in points (worst by magnitude); `-` for none."""
    if not errors:
        return "-"
    worst = max(errors.values(), key=abs)
    return f"{worst:+6.1f} / {statistics.fmean(errors.values()):+5.1f}"
