"""A discrete-event model of data-parallel GPU training steps, with its own per-step truth.

Each rank has a host thread, a compute stream and a communication stream; the ranks are coupled
by their all_reduces. One step, in the order a DDP loop issues it:

- the host waits for the previous step to end on the device (a ``loss.item()``), spends
  `StepShape.host_ms` plus the case's delay for that rank and step (a late peer, a data stall),
  then launches the step's kernels one every `launch_us`;
- the compute stream runs the forward kernels, then the backward in `buckets` segments; at the end
  of each segment a gradient bucket is ready and its all_reduce is launched on the communication
  stream, which runs them in order;
- an all_reduce starts on a rank when its stream gets to it and its bucket is ready there, and it
  ends on every rank `comm_ms` (times the case's link scale) after the *last* rank started it: the
  ranks that got there first have kernels that span the wait, as NCCL's do;
- the optimizer waits for the last all_reduce (DDP's stream wait), then the step ends.

A step's window on the device is the one the engine and the agent's device timer use
(docs/definitions.md#step-buckets): from its first kernel's start to the next step's first kernel's
start. The model's truth per step comes from its own intervals: compute is the compute stream's
busy time, exposed communication the communication kernels' time with no compute kernel running,
idle the rest.

It writes what a real rank leaves behind: a Kineto trace of chosen steps (`window_trace`, through
`tests.support.trace_builder`, whose event shapes follow real traces) and a flight-recorder entry
for every all_reduce (`flight_entries`, the shape of PyTorch's NCCL recorder dump with timing on,
`tests.support.fr_dumps.nccl_entry`), its duration the span of the NCCL start and end events
around the kernel (`StepShape.fr_pad_us` on each side).
"""

from __future__ import annotations

import bisect
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from tests.support.fr_dumps import nccl_entry
from tests.support.trace_builder import AUTOGRAD_TID, MAIN_TID, Group, TraceBuilder

__all__ = [
    "BASE_UNIX_NS",
    "CASES",
    "GROUP",
    "ModelCase",
    "ModelRank",
    "ModelStep",
    "StepShape",
    "StepTruth",
    "flight_entries",
    "simulate",
    "window_trace",
]

BASE_UNIX_NS = 1_763_700_000_000_000_000
GROUP = Group("0", "default_pg", (0, 1))
COMPUTE_STREAM = 7
COMM_STREAM = 40


@dataclass(frozen=True)
class StepShape:
    """One rank's step (milliseconds unless named otherwise): by default a step of ~75 ms of
    compute whose five 24 MiB gradient all_reduces of 5 ms each hide under the backward but the
    last one."""

    forward_kernels: int = 6
    forward_ms: float = 4.0
    buckets: int = 5
    bucket_kernels: int = 3
    backward_ms: float = 3.2
    optimizer_kernels: int = 2
    optimizer_ms: float = 1.0
    bucket_elems: int = 6 << 20  # fp32 elements per gradient bucket
    comm_ms: float = 5.0  # one bucket's all_reduce on a healthy link, no wait
    host_ms: float = 0.4  # host time from the previous step's end to the first launch
    launch_us: float = 10.0  # host time per launch
    jitter: float = 0.05  # each kernel's duration varies by up to this share
    fr_pad_us: float = 2.0  # NCCL's start / end events around the kernel, each side
    watchdog_ms: float = 2.0  # from a collective's end to the recorder marking it completed


Scale = Callable[[int], float]  # step -> factor
Delay = Callable[[int, int], float]  # (step, rank) -> ms


def _one(step: int) -> float:
    return 1.0


def _none(step: int, rank: int) -> float:
    return 0.0


@dataclass(frozen=True)
class ModelCase:
    """A scenario: `comm_scale` multiplies every all_reduce's transfer time at a step,
    `host_delay_ms` delays a rank's host before it launches a step."""

    name: str
    comm_scale: Scale = _one
    host_delay_ms: Delay = _none
    shape: StepShape = field(default_factory=StepShape)


def _slower_from(step: int) -> Scale:
    return lambda k: 1.5 if k >= step else 1.0


def _late(rank: int, ms: float) -> Delay:
    return lambda k, r: ms if r == rank else 0.0


def _stall(every: int, ms: float, rank: int | None) -> Delay:
    return lambda k, r: ms if k % every == 0 and (rank is None or r == rank) else 0.0


def _growing(first: float, last: float, steps: int) -> Scale:
    return lambda k: first + (last - first) * min(k, steps - 1) / (steps - 1)


CASES: tuple[ModelCase, ...] = (
    ModelCase("steady"),
    ModelCase("link 50% slower from step 100", comm_scale=_slower_from(100)),
    ModelCase("rank 1 5 ms late every step", host_delay_ms=_late(1, 5.0)),
    ModelCase("data stall 20 ms every 10th step, rank 1", host_delay_ms=_stall(10, 20.0, 1)),
    ModelCase("data stall 20 ms every 10th step, all ranks", host_delay_ms=_stall(10, 20.0, None)),
    # 3 ms to 15 ms per bucket over 300 steps: past the 9.6 ms backward segment hiding each.
    ModelCase("comm grows past the compute hiding it", comm_scale=_growing(0.6, 3.0, 300)),
)


@dataclass(frozen=True)
class StepTruth:
    """The model's own buckets of one step on one rank (seconds)."""

    wall_s: float
    compute_s: float
    exposed_comm_s: float
    idle_s: float


@dataclass
class ModelStep:
    """One step of one rank; times are microseconds of model time (0 = `BASE_UNIX_NS`)."""

    step: int
    host_start: float  # the host's step start (its ``ProfilerStep`` range opens here)
    device_start: float = 0.0  # the first kernel's start
    device_end: float = 0.0  # the next step's first kernel's start (the last: its own end)
    # (start, duration, launch) of each kernel
    compute: list[tuple[float, float, float]] = field(default_factory=list)
    comms: list[tuple[float, float, float]] = field(default_factory=list)
    truth: StepTruth | None = None


@dataclass
class ModelRank:
    rank: int
    steps: list[ModelStep] = field(default_factory=list)


def simulate(case: ModelCase, steps: int, *, ranks: int = 2, seed: int = 0) -> list[ModelRank]:
    """Run `steps` steps of `case` on `ranks` ranks (deterministic for a seed)."""
    shape = case.shape
    rng = random.Random(seed)
    out = [ModelRank(r) for r in range(ranks)]
    host_free = [0.0] * ranks  # when each host may start its next step
    compute_free = [0.0] * ranks
    comm_free = [0.0] * ranks

    def duration(ms: float) -> float:
        return ms * 1e3 * (1.0 + shape.jitter * (2.0 * rng.random() - 1.0))

    for k in range(steps):
        ready: list[list[float]] = []  # per rank: when each bucket is ready on the device
        launched: list[list[float]] = []  # per rank: when each all_reduce was launched
        for r in range(ranks):
            start = host_free[r] + (shape.host_ms + case.host_delay_ms(k, r)) * 1e3
            step = ModelStep(k, start)
            out[r].steps.append(step)
            launch = start
            free = compute_free[r]
            bucket_ready, comm_launch = [], []

            def run(ms: float, step: ModelStep = step) -> None:
                nonlocal launch, free
                launch += shape.launch_us
                begin = max(launch, free)
                length = duration(ms)
                step.compute.append((begin, length, launch))
                free = begin + length

            for _ in range(shape.forward_kernels):
                run(shape.forward_ms)
            for _ in range(shape.buckets):
                for _ in range(shape.bucket_kernels):
                    run(shape.backward_ms)
                launch += shape.launch_us  # the autograd hook launches the bucket's all_reduce
                bucket_ready.append(free)
                comm_launch.append(launch)
            compute_free[r] = free
            step.device_start = step.compute[0][0]
            ready.append(bucket_ready)
            launched.append(comm_launch)
        scale = case.comm_scale(k)
        for b in range(shape.buckets):
            begins = [max(ready[r][b], comm_free[r], launched[r][b]) for r in range(ranks)]
            end = max(begins) + duration(shape.comm_ms * scale)
            for r in range(ranks):
                out[r].steps[k].comms.append((begins[r], end - begins[r], launched[r][b]))
                comm_free[r] = end
        for r in range(ranks):
            step = out[r].steps[k]
            launch = step.comms[-1][2]
            free = max(compute_free[r], comm_free[r])  # the optimizer waits for the last bucket
            for _ in range(shape.optimizer_kernels):
                launch += shape.launch_us
                begin = max(launch, free)
                length = duration(shape.optimizer_ms)
                step.compute.append((begin, length, launch))
                free = begin + length
            compute_free[r] = free
            host_free[r] = free  # the host's loss.item() returns when the step ends
    for model in out:
        for step, following in zip(model.steps, [*model.steps[1:], None], strict=True):
            last = max(s + d for s, d, _ in [*step.compute, *step.comms])
            step.device_end = following.device_start if following is not None else last
            step.truth = _truth(step)
    return out


def _truth(step: ModelStep) -> StepTruth:
    """Buckets of the step's window from its intervals (the compute stream's kernels never
    overlap one another; a collective's time with no compute kernel running is exposed)."""
    compute = sorted((s, s + d) for s, d, _ in step.compute)
    starts = [s for s, _ in compute]
    exposed = 0.0
    for begin, length, _ in step.comms:
        end = begin + length
        covered = 0.0
        i = max(bisect.bisect_right(starts, begin) - 1, 0)
        while i < len(compute) and compute[i][0] < end:
            covered += max(0.0, min(end, compute[i][1]) - max(begin, compute[i][0]))
            i += 1
        exposed += length - covered
    wall = step.device_end - step.device_start
    busy = sum(d for _, d, _ in step.compute)
    return StepTruth(wall * 1e-6, busy * 1e-6, exposed * 1e-6, (wall - busy - exposed) * 1e-6)


def window_trace(rank: ModelRank, steps: Sequence[int], shape: StepShape) -> dict[str, Any]:
    """The Kineto trace a profiler window over `steps` (consecutive) would leave on this rank:
    ``ProfilerStep#N`` from each host start to the next, the kernels with their launches, the
    all_reduces launched from the autograd thread with their collective metadata."""
    builder = TraceBuilder(rank=rank.rank, world_size=len(GROUP.ranks), groups=(GROUP,))
    builder.base_time_ns = BASE_UNIX_NS
    by_step = {s.step: s for s in rank.steps}
    for number in steps:
        step = by_step[number]
        following = by_step.get(number + 1)
        end = following.host_start if following is not None else step.device_end
        builder.profiler_step(number, step.host_start, end)
        for begin, length, launch in step.compute:
            builder.kernel(begin, length, stream=COMPUTE_STREAM, launch_at=launch)
        for begin, length, launch in step.comms:
            builder.comm_kernel(
                begin,
                length,
                op="all_reduce",
                nelems=shape.bucket_elems,
                group=GROUP,
                stream=COMM_STREAM,
                launch_at=launch,
                launch_tid=AUTOGRAD_TID,
            )
    builder.thread_name(MAIN_TID, "python")
    return builder.build()


@dataclass(frozen=True)
class FlightOp:
    """One recorder entry and when the recorder has it as completed (model µs)."""

    created: float
    done_at: float
    entry: dict[str, Any]


def flight_entries(rank: ModelRank, shape: StepShape, *, timed: bool = True) -> list[FlightOp]:
    """Every all_reduce of the rank as its NCCL flight recorder records it (record ids and
    sequence numbers from 0 and 1; `timed`: with ``duration_ms``, as with NCCL timing on)."""
    ops: list[FlightOp] = []
    for step in rank.steps:
        for begin, length, launch in step.comms:
            n = len(ops)
            duration_ms = (length + 2 * shape.fr_pad_us) / 1e3
            entry = nccl_entry(
                n,
                n + 1,
                group=(GROUP.name, GROUP.desc),
                shape=(shape.bucket_elems,),
                created_ns=BASE_UNIX_NS + int(launch * 1e3),
                duration_ms=duration_ms if timed else None,
            )
            done_at = begin + length + shape.fr_pad_us + shape.watchdog_ms * 1e3
            ops.append(FlightOp(launch, done_at, entry))
    return ops
