"""Run `ddp_truth_job.py` and compare the agent's exposed communication and idle time with what the
job knows of its own steps (its DDP communication hook's timestamps and its data stalls).

Shares are in points (percent of a step), as in `ground_truth.py`: for a step report, its
`exposed_comm` seconds and the job's exposed seconds, both over the report's `wall_s`.

The job's exposed communication of a step (`exposed_s`) is what docs/definitions.md#step-buckets
counts on a CPU timeline, as far as the job can see it: the time a collective is in flight while
the training thread runs no operator. It sees two parts:

- the reducer's wait: from the launch of the last bucket (the backward pass has computed the last
  gradient) until the last bucket's all-reduce completed (0 when all completed before);
- the calls into `all_reduce` that launch the earlier buckets, during the backward pass: each
  call only enqueues the work (docs/definitions.md#blocked-waits-on-cpu: the ``c10d::*``
  operator is not compute, and its collective is in flight from then), which takes tens of
  microseconds, but on a loaded machine the caller can be preempted inside it by the worker
  it wakes and wait milliseconds for a CPU.

What it cannot see: the autograd engine's own gaps between operators while a bucket is in flight
(microseconds each, more when the thread is preempted there), which the trace also counts as
exposed. And its completion callback needs the GIL: where another thread holds it, the completion
is noted late. The stall (`stall_s`) is time asleep in the data path, with no collective in flight:
idle.
"""

from __future__ import annotations

import json
import math
import statistics
import subprocess
from dataclasses import dataclass
from pathlib import Path

from mfuscope.core.schema import StepReport

from tests.support.ground_truth import Errors, errors_against, read_reports, run_job

HERE = Path(__file__).resolve().parent
JOB = HERE / "ddp_truth_job.py"


@dataclass(frozen=True)
class Clock:
    """The training thread's clock read at one instant: CPU time and run delay so far (ns), and
    `perf_counter_ns`."""

    cpu_ns: int
    run_delay_ns: int
    perf_ns: int


@dataclass(frozen=True)
class StepTruth:
    """One step as the job saw it (seconds)."""

    step: int
    wait_s: float  # the reducer's wait: last launch to last completion
    calls_s: float  # inside the calls that launched the earlier buckets
    stall_s: float  # asleep in the data path
    wake_s: float  # last completion to the syncing backward's return
    start: Clock
    end: Clock
    buckets: int = 0  # all-reduced on the step
    first_launch_s: float = 0.0  # after the step's start
    last_launch_s: float = 0.0

    @property
    def exposed_s(self) -> float:
        return self.wait_s + self.calls_s


def step_truth(row: dict[str, object]) -> StepTruth:
    """A `ddp_truth_job.py` row as a `StepTruth` (see the module docstring)."""
    launched = _floats(row["launched"])
    called = _floats(row["called"])
    completed = _floats(row["completed"])
    last = max(launched)
    wait = max(max(completed) - last, 0.0)
    calls = math.fsum(c - t for t, c in zip(launched, called, strict=True) if t < last)
    clocks = row["clock"]
    assert isinstance(clocks, list)
    backward = row["backward_s"]
    assert isinstance(backward, float)
    stall = row["stall_s"]
    assert isinstance(stall, float)
    step = row["step"]
    assert isinstance(step, int)
    return StepTruth(
        step=step,
        wait_s=wait,
        calls_s=calls,
        stall_s=stall,
        wake_s=max(backward - max(last, max(completed)), 0.0),
        start=Clock(*clocks[0]),
        end=Clock(*clocks[-1]),
        buckets=len(launched),
        first_launch_s=min(launched),
        last_launch_s=last,
    )


def _floats(value: object) -> list[float]:
    assert isinstance(value, list)
    return [float(v) for v in value]


@dataclass(frozen=True)
class Run:
    """Where a finished run left its outputs (``{rank}`` in the paths)."""

    jsonl: str
    truth: str
    traces: Path

    def reports(self, rank: int) -> dict[int, StepReport]:
        return read_reports(self.jsonl.replace("{rank}", str(rank)))

    def steps(self, rank: int) -> dict[int, StepTruth]:
        rows = json.loads(Path(self.truth.replace("{rank}", str(rank))).read_text())["steps"]
        return {row["step"]: step_truth(row) for row in rows}

    def trace_files(self, rank: int) -> list[Path]:
        return sorted(self.traces.glob(f"mfuscope-rank{rank}-*"))


def run(
    workdir: Path, steps: int, *options: str, batch: int = 2, timeout_s: float = 300.0
) -> tuple[Run, subprocess.CompletedProcess[str]]:
    """Run the job on 2 gloo ranks with agent `options` (``NAME=VALUE``), keeping every
    window's trace in ``workdir/traces``."""
    result = Run(
        str(workdir / "ddp-{rank}.jsonl"), str(workdir / "truth-{rank}.json"), workdir / "traces"
    )
    done = run_job(JOB, workdir, result.jsonl, steps, options, timeout_s, f"--batch={batch}")
    return result, done


def report_errors(run_: Run, rank: int) -> Errors:
    """The agent's exposed communication against the job's, per step (points)."""
    truth = {s: t.exposed_s for s, t in run_.steps(rank).items()}
    return errors_against(run_.reports(rank), truth, None)


def trace_errors(run_: Run, rank: int) -> dict[int, float]:
    """`mfuscope analyze`'s engine on the kept traces against the job, per step (points of the
    step's window on the trace)."""
    from mfuscope.core.trace import analyze_trace, read_trace

    truth = run_.steps(rank)
    errors: dict[int, float] = {}
    for path in run_.trace_files(rank):
        for step in analyze_trace(read_trace(path)).steps:
            if step.step in truth:
                exposed = truth[step.step].exposed_s
                errors[step.step] = 100 * (step.exposed_comm_s - exposed) / step.wall_s
    return errors


@dataclass(frozen=True)
class Stalls:
    """The carried steps with a data stall: per step, the stall and what the report put in
    exposed communication beyond the job's and in idle (seconds); `other_extra_comm_s` and
    `other_idle_s`: the same on the carried steps without one."""

    stall_s: dict[int, float]
    extra_comm_s: dict[int, float]
    idle_s: dict[int, float]
    other_extra_comm_s: dict[int, float]
    other_idle_s: dict[int, float]

    @property
    def comm_gained(self) -> float:
        """How much more the stalled steps' reports put in communication beyond the job's than
        the other carried steps' did, as a part of the stall (0: none of it; 1: all of it): the
        mean of each, their difference over the mean stall."""
        return _gained(self.extra_comm_s, self.other_extra_comm_s, self.stall_s)

    @property
    def idle_gained(self) -> float:
        """How much more idle the stalled steps carry than the others, as a part of the stall."""
        return _gained(self.idle_s, self.other_idle_s, self.stall_s)


def _gained(stalled: dict[int, float], other: dict[int, float], stall: dict[int, float]) -> float:
    if not stalled or not other:
        return math.nan
    more = statistics.fmean(stalled.values()) - statistics.fmean(other.values())
    return more / statistics.fmean(stall.values())


def stalls(run_: Run, rank: int) -> Stalls:
    """Where the carried steps with a data stall put it."""
    truth = run_.steps(rank)
    stall: dict[int, float] = {}
    extra: dict[int, float] = {}
    idle: dict[int, float] = {}
    other_extra: dict[int, float] = {}
    other: dict[int, float] = {}
    for step, report in run_.reports(rank).items():
        known = truth.get(step)
        if known is None or not report.components or report.breakdown_step == step:
            continue  # not the job's, before the first window, or a profiled step
        parts: dict[str, float] = {}
        for c in report.components:
            parts[c.component] = parts.get(c.component, 0.0) + c.seconds
        if known.stall_s <= 0:
            other_extra[step] = parts.get("exposed_comm", 0.0) - known.exposed_s
            other[step] = parts.get("bubble_idle", 0.0)
            continue
        stall[step] = known.stall_s
        extra[step] = parts.get("exposed_comm", 0.0) - known.exposed_s
        idle[step] = parts.get("bubble_idle", 0.0)
    return Stalls(stall, extra, idle, other_extra, other)
