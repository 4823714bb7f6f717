"""A 2-rank gloo job that times its own phases, for comparing the agent's step breakdown with
ground truth (`tests/support/ground_truth.py`; the test in tests/integration and
`benchmarks/ground_truth.py` run it).

Run under torchrun:

    OMP_NUM_THREADS=1 PYTHONPATH=. torchrun --standalone --nproc_per_node=2 \
        tests/support/ground_truth_job.py \
        --steps 300 --jsonl /tmp/gt-{rank}.jsonl --truth /tmp/gt-truth-{rank}.json \
        --option profile_first_step=10 --option profile_every_steps=60

Each step, inside `agent.step()`, and each phase timed with `time.perf_counter`:

- compute: 12 x (matmul + tanh) on 256 x 256 float32;
- a blocking all_reduce of 1 MiB: the time from the call until its work completed (a callback
  on its future notes when, on gloo's worker thread) is the step's communication, and the time
  from then until the call returns is noted apart: on a loaded machine the woken caller can wait
  milliseconds for a CPU, with nothing in flight any more;
- a sleep: 4 ms on rank 0, 2 ms on rank 1. Rank 1 therefore reaches the next all_reduce about
  2 ms before rank 0 and waits for it inside the collective: its communication share swings
  from step to step with the ranks' relative speed (between ~5 % and ~35 % of its step on a
  loaded 2-core machine), which is what makes a sampled breakdown hard to carry.

Each rank writes ``{"steps": [[step, compute_s, comm_s, wake_s, sleep_s, unknown, *start, *end],
...]}`` to `--truth` (``{rank}`` replaced), `unknown` not 0 on a step where the thread stalled
around the call, so that its completion time, and so `comm_s` and `wake_s`, may not be known (see
`PROMPT_S` and the comment where it is used: under load the thread can wait milliseconds for the
GIL or a CPU there; the code says which stall). `start` and `end` are the training thread's
``/proc/thread-self/schedstat`` (CPU time, run delay, ns) and `perf_counter_ns` at the step's start
and end inside `agent.step()`, for scoring carried rules offline (`benchmarks/carried_rules.py`).
The agent runs with its ordinary options plus `--option NAME=VALUE`.
"""

from __future__ import annotations

import argparse
import os
import time

import torch
import torch.distributed as dist
from mfuscope.agent import Agent

from tests.support import job_exit

SIZE = 256
MATMULS = 12
COMM_ELEMENTS = (1 << 20) // 4  # 1 MiB of float32
SLEEP_S = {0: 0.004, 1: 0.002}
# A call into the collective, or the few lines to its wait, that took longer than this stalled.
PROMPT_S = 0.0005


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--jsonl", required=True)
    parser.add_argument("--truth", required=True)
    parser.add_argument("--option", action="append", default=[], help="agent NAME=VALUE")
    args = parser.parse_args()

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(rank)
    weight = torch.randn(SIZE, SIZE) / SIZE**0.5
    x0 = torch.randn(SIZE, SIZE)
    buffer = torch.ones(COMM_ELEMENTS)
    options: dict[str, object] = {"flops_per_step": 2.0 * SIZE**3 * MATMULS, "peak_flops": 1e11}
    options.update(item.split("=", 1) for item in args.option)
    agent = Agent(job="ground-truth", jsonl_path=args.jsonl, **options)  # type: ignore[arg-type]
    sleep_s = SLEEP_S[rank]
    rows: list[list[float]] = []
    completed: list[float] = []

    def note_completion(_: object) -> None:
        completed.append(time.perf_counter())

    world = dist.group.WORLD
    assert world is not None
    clock = os.open("/proc/thread-self/schedstat", os.O_RDONLY)
    for step in range(args.steps):
        with agent.step():
            cpu_ns, run_delay_ns = (int(v) for v in os.pread(clock, 64, 0).split()[:2])
            perf_ns = time.perf_counter_ns()
            t0 = time.perf_counter()
            x = x0
            for _ in range(MATMULS):
                x = torch.tanh(x @ weight)
            t1 = time.perf_counter()
            # dist.all_reduce(buffer) on the group itself (no Python wrapper before the enqueue),
            # with the moment its work completes noted on the worker
            work = world.allreduce([buffer])
            returned = time.perf_counter()
            finished_first = work.is_completed()
            work.get_future().add_done_callback(note_completion)
            waiting = time.perf_counter()
            work.wait()
            t2 = time.perf_counter()
            time.sleep(sleep_s)
            t3 = time.perf_counter()
            end = [int(v) for v in os.pread(clock, 64, 0).split()[:2]] + [time.perf_counter_ns()]
        done = min(completed.pop(), t2)
        # The completion time is known when this thread ran promptly around the call. Not when
        # the call returned late (it waited for a CPU, or for the GIL after its enqueue), nor when
        # the work was complete before the callback was set (the callback then notes the
        # registration), nor when the thread stalled holding the GIL before `wait` (the
        # callback, which needs the GIL, then runs late): under load each of these took
        # milliseconds, time the script would count as communication with nothing in flight.
        # Which, as a code (0: known): 1 complete first, 3 stalled before `wait`, 2 only returned
        # late (the work still in flight when the callback was set, `wait` reached promptly).
        unknown = (
            1.0
            if finished_first
            else 3.0
            if waiting - returned > PROMPT_S
            else 2.0
            if returned - t1 > PROMPT_S
            else 0.0
        )
        rows.append([step, t1 - t0, done - t1, t2 - done, t3 - t2, unknown])
        rows[-1] += [cpu_ns, run_delay_ns, perf_ns, *end]  # see the module docstring
    agent.close(60.0)
    os.close(clock)
    job_exit.finish(args.truth, {"steps": rows})


if __name__ == "__main__":
    job_exit.freeze_at_exit()
    main()
