"""Against ground truth: a 2-rank gloo job that times its own phases with `perf_counter`
(`tests/support/ground_truth_job.py`: 12 matmul + tanh, a blocking 1 MiB all_reduce, then a sleep
of 4 ms on rank 0 and 2 ms on rank 1, so rank 1 waits for rank 0 inside the all_reduce).

One short job serves both checks: the kept traces of its windows go through `mfuscope analyze`'s
engine, and the live agent's reports of the same window steps carry their own breakdown. On every
profiled step of both ranks, exposed communication must be within 5 points of the share of the step
the script spent blocked in the all_reduce until its work completed, and within 2 points on
average. Both sides of each comparison come from the same step of the same run, so the machine's
load (other tests beside it) moves them together.

Compute and idle are not compared: the Python between the ops (the loop, the calls into the group's
allreduce and `time.sleep`) is idle by definition (docs/definitions.md#step-buckets), while the
script's timers count it in the phase around it. The call into the allreduce is such a gap too,
which is why exposed comm reads a fraction of a point below the script's time on most steps. So is
the time a woken caller waits for a CPU after its work completed, nothing in flight any more: under
load (the profiler starting on the peer, tests beside this one on 2 cores) it reached 8 ms of a
30 ms step here. The job notes it apart, and the comparison is with the time until completion.
A step where the training thread stalled around the call (it returned more than 0.5 ms late, or
after the work had completed, or the thread stalled holding the GIL before its wait, which delays
the completion callback) is left out of the profiled steps' checks: with two jobs side by side such
stalls took 2-7 ms here, time the script may count as communication with nothing in flight. The
carried steps' check keeps those whose call only returned late, the work still in flight
(`ground_truth.Run.comm_s`): under load they are a quarter to a half of the steps, the ones where
the thread waited for a CPU inside the call, which the trace counts as communication too and the
carried steps must hold; left out, they would favour a rule that carries no such wait.
"""

from __future__ import annotations

import statistics

import pytest

from tests.support import ground_truth

STEPS = 70
OPTIONS = (
    "profile_first_step=5",
    "profile_steps=6",  # 6 steps: under load a few have no known completion time
    "profile_every_steps=20",
    "profile_max_overhead_ratio=1",
    "profile_every_s=1000",
    # The flight-recorder reader's dump holds the GIL for milliseconds (docs/agent.md): a
    # training thread stalled by it before the enqueue is time the script counts in its
    # all_reduce and the trace shows as nothing running (idle by definition). Measured here with
    # `dist.all_reduce` (Python before the enqueue; 300 steps, windows every 60): with the
    # reader, 4 runs of 10 had a profiled step off by 13-59 points; without it, none of 4.
    "collective_records=0",
)


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> ground_truth.Run:
    workdir = tmp_path_factory.mktemp("ground-truth")
    result, done = ground_truth.run(workdir, STEPS, *OPTIONS)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return result


def _check(errors: dict[int, float], what: str, run: ground_truth.Run, rank: int) -> None:
    # a window of 6 steps at least, less the steps whose completion time the script does not know
    assert len(errors) >= 2, (
        what,
        errors,
        f"steps the script left out: {run.unknown_steps(rank)}",
        f"kept traces: {[path.name for path in run.trace_files(rank)]}",
    )
    worst = max(errors, key=lambda step: abs(errors[step]))
    assert abs(errors[worst]) <= 5.0, (what, worst, errors)
    assert abs(statistics.fmean(errors.values())) <= 2.0, (what, errors)


@pytest.mark.slow
@pytest.mark.parametrize("rank", [0, 1])
def test_analyze_exposed_comm_is_the_time_blocked_in_the_collective(
    run: ground_truth.Run, rank: int
) -> None:
    _check(ground_truth.trace_errors(run, rank), f"analyze, rank {rank}", run, rank)
    assert len(ground_truth.trace_errors(run, rank)) + len(run.unknown_steps(rank)) >= 6


@pytest.mark.slow
@pytest.mark.parametrize("rank", [0, 1])
def test_live_agent_exposed_comm_is_the_time_blocked_in_the_collective(
    run: ground_truth.Run, rank: int
) -> None:
    errors = ground_truth.report_errors(run, rank, late=False)
    _check(errors.window, f"agent, rank {rank}", run, rank)
    # The same steps as the traces: the agent's reports of its windows are those decompositions.
    assert set(errors.window) == set(ground_truth.trace_errors(run, rank))
    reports = run.reports(rank)
    # Each window step's period holds the profiler's own calls as `instrumentation`, and its
    # measured buckets are what the trace saw; the first window step holds the profiler's start.
    first = min(step for step, report in reports.items() if report.breakdown_step == step)
    ours = {c.component: c.seconds for c in reports[first].components}
    assert ours.get("instrumentation", 0.0) > 0.0, reports[first]


@pytest.mark.slow
@pytest.mark.parametrize("rank", [0, 1])
def test_carried_steps_take_their_exposed_comm_from_their_own_blocked_time(
    run: ground_truth.Run, rank: int
) -> None:
    # The steps between windows carry their own exposed comm (docs/definitions.md
    # #carried-breakdowns): over their time within 9 points of what the script spent in the
    # all_reduce. The target, 4 points over ~300 steps per rank, is benchmarks/ground_truth.py's;
    # this run has ~45 carried steps and 2-4 windows, where under load a window whose steps
    # waited for a CPU inside the collective more or less than the steps after it moves the mean
    # by a few points: with the machine's load average at 5-9 from other work, this run was off
    # by up to 5.1 points, recorded runs of it by up to 3.8, and one clean-clone CI run (the
    # other worker's CPU-bound tests beside it) by 7.5. A share carried from the window misses by
    # 10-30 points on this job, whose wait moves from step to step: the bound, 9, tells that
    # apart, not the rule before (8.0; benchmarks/ground_truth.py measures the difference).
    errors = ground_truth.report_errors(run, rank)
    assert len(errors.carried) >= 20, errors.carried
    assert abs(errors.carried_time_weighted) <= 9.0, (errors.carried_time_weighted, errors.carried)
