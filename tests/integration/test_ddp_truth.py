"""Against a DDP loop that knows its own exposed communication (`tests/support/ddp_truth_job.py`): a
small GPT under plain DDP on 2 gloo ranks, 7-8 gradient buckets all-reduced during the backward
pass, 2 micro-steps per optimizer step with `no_sync` on the first, one `agent.step()` per optimizer
step, and a 25 ms stall in the data loader every 7 steps, at a different step on each rank. The
job's communication hook times every bucket's launch and completion (`tests/support/ddp_truth.py`
says what that truth counts, and what it cannot see).

One short job serves every check: the kept traces of its windows through `mfuscope analyze`'s
engine, the agent's reports of the same window steps, and its reports of the steps between
windows, which carry their exposed communication from their own blocked time
(docs/definitions.md#carried-breakdowns). Both sides of each comparison come from the same step of
the same run, so the machine's load (other tests beside it) moves them together.

Bounds, and why they are looser than `benchmarks/ddp_truth.py`'s target (4 points per rank over
~300 steps): this run has ~75 carried steps, and under load the thread waits for a CPU inside the
collectives' calls (tens of milliseconds on a loaded 2-core machine), a wait each carried step holds
about as much as the window's least-waiting step did, not exactly: a window whose steps waited
unusually long (33 ms against the 5.5 ms of the steps after it) moved a rank-run by 5.8 points;
6 runs of this test alone stayed within 3.6 points per rank, and one in the whole suite (the other
worker's CPU-bound tests beside it) read 8.8. The bound is 10: the rule before read about as much
on average, and what tells the two apart is the stall check below (0.5-0.9 of each stall read as
communication before, none now). On profiled steps the trace
also counts the thread's preemption between autograd operators while a bucket is in flight, which
the job cannot see, and the job's completion callbacks need the GIL, so they can run late: single
profiled steps were off by up to 20 points, and by a point on average, in
`benchmarks/ddp_truth.py` runs with the machine's load average at 5-9.
"""

from __future__ import annotations

import statistics

import pytest

from tests.support import ddp_truth
from tests.support.ddp_truth_job import STALL_AT, STALL_EVERY

STEPS = 100
OPTIONS = (
    "profile_first_step=10",
    "profile_every_steps=30",
    "profile_max_overhead_ratio=1",
    "profile_every_s=1000",
)


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> ddp_truth.Run:
    workdir = tmp_path_factory.mktemp("ddp-truth")
    result, done = ddp_truth.run(workdir, STEPS, *OPTIONS, batch=1)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return result


@pytest.mark.slow
@pytest.mark.parametrize("rank", [0, 1])
def test_the_job_is_a_ddp_loop_with_overlapped_buckets(run: ddp_truth.Run, rank: int) -> None:
    steps = run.steps(rank)
    assert len(steps) == STEPS
    # several buckets per optimizer step, the first launched while the backward pass still ran
    # (the last one, once it was done); none on the no_sync micro-step. DDP's first step has a
    # bucket of its own: it sets the buckets from the order the gradients came in.
    for truth in list(steps.values())[1:]:
        assert truth.buckets >= 3, truth
        assert truth.first_launch_s < truth.last_launch_s
    stalled = sum(s % STALL_EVERY == STALL_AT[rank][0] for s in range(STEPS))
    assert sum(t.stall_s > 0 for t in steps.values()) == stalled


@pytest.mark.slow
@pytest.mark.parametrize("rank", [0, 1])
def test_profiled_steps_agree_with_the_job(run: ddp_truth.Run, rank: int) -> None:
    for errors, what in (
        (ddp_truth.trace_errors(run, rank), "analyze"),
        (ddp_truth.report_errors(run, rank).window, "agent"),
    ):
        # 3 windows of 3 steps, or 2 where the schedule postponed one (an analysis still out)
        assert len(errors) >= 6, (what, errors)
        worst = max(errors, key=lambda step: abs(errors[step]))
        assert abs(errors[worst]) <= 25.0, (what, worst, errors)
        # One window of 3 steps can read 9-15 points low under the suite's load (the thread
        # preempted while a bucket is in flight, see above), which moves a 9-step mean by 4:
        # one clean-clone CI run read -3.1 on a rank. The benchmark's means stay within 1.1.
        assert abs(statistics.fmean(errors.values())) <= 5.0, (what, errors)


@pytest.mark.slow
@pytest.mark.parametrize("rank", [0, 1])
def test_carried_steps_hold_their_exposed_comm(run: ddp_truth.Run, rank: int) -> None:
    errors = ddp_truth.report_errors(run, rank)
    assert len(errors.carried) >= 60, errors.carried
    assert abs(errors.carried_time_weighted) <= 10.0, (
        errors.carried_time_weighted,
        errors.carried,
    )


@pytest.mark.slow
@pytest.mark.parametrize("rank", [0, 1])
def test_a_data_stall_is_idle_not_communication(run: ddp_truth.Run, rank: int) -> None:
    stalls = ddp_truth.stalls(run, rank)
    assert len(stalls.stall_s) >= 8, stalls
    # the stalled steps' comm is off the job's by no more than the other carried steps' is, but
    # for a small part of the stall (each is off by a few ms either way; the rule before read
    # 0.5-0.9 of each stall as communication) ...
    assert stalls.comm_gained <= 0.3, stalls
    # ... and the stall is in their idle time
    assert stalls.idle_gained >= 0.7, stalls
