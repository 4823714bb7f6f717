"""Step wall time, every step, without slowing the step down or synchronising the device.

A step's wall time is the *period* from its start to the next step's start, the same window the
engine uses on the device timeline (docs/definitions.md#step-window): time spent between two
steps (data loading, logging) belongs to the step before it, as bubble. The last step ends at
its own end.

- CPU: the agent's step recorder (`mfuscope.agent._step_recorder`) reads a monotonic clock at
  each step boundary and the periodic thread turns the readings into periods; no timer object.
- GPU: the same clock readings give each step's start on the wall clock, and the device gives
  its period. At each step start the recorder records one pooled CUDA event into a ring beside
  its clock readings (at a step's end, one reused event); `DeviceEventStepTimer` (this module)
  reads them on the periodic thread with the non-blocking `query()` once the device has passed
  them, and `elapsed_time` gives the device-side period. It never synchronises the device: not on
  the training thread, not on the periodic thread, not at close (close polls `query()` until its
  deadline). PyTorch's `CUDAEvent` may be queried and timed from any thread and device
  (`c10/cuda/CUDAEvent.h`); `elapsed_time` of an event not yet completed raises rather than
  waits, and the timer never asks for one.

The CUDA calls a step boundary makes are `DeviceCalls` (`cuda_calls` builds them from torch), so
tests fake them. They avoid what `torch.cuda.Event.record()` does per call without a stream (a
Python frame, `torch.cuda.current_stream()`, which builds a new `Stream` object): the recorder
calls the C binding `torch._C._CudaEventBase.record(event, stream)` on a stream object it
fetched once, and asks `torch._C._cuda_getCurrentRawStream` (an int, 0 on the default stream)
whether the current stream is still that one.

Threads: the training thread records events and takes spent ones from `pool`; `poll` and
`finish` run on the agent's periodic thread (at close, on the closing thread once that thread
has stopped), which returns spent start events to `pool`. Only the training thread pops the pool
and only the periodic thread appends to it, each deque operation atomic under the GIL, so no
event is created per step once the pool holds a few. The ring of events follows the rules of
the recorder's ring of starts (`_step_recorder`: one producer, one consumer, published by the
count of steps begun; a slot the producer may have rewritten while it was read is dropped).
"""

from __future__ import annotations

import collections
import functools
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from mfuscope.core.schema import MIN_STEP_SECONDS

if TYPE_CHECKING:
    from mfuscope.agent._step_recorder import StepRecorder

__all__ = [
    "DeviceCalls",
    "DeviceEvent",
    "DeviceEventStepTimer",
    "StepTimer",
    "TimedStep",
    "cuda_calls",
]


@dataclass(frozen=True)
class TimedStep:
    """One finished step: its number, host wall-clock start (ns since epoch), period (s), and
    on CPU timelines the time the training thread was blocked in it and the time it waited for
    a CPU (s; `thread_clock`)."""

    step: int
    start_unix_ns: int
    wall_s: float
    blocked_s: float | None = None
    run_delay_s: float | None = None


class StepTimer(Protocol):
    """Step periods measured on a device, read on the periodic thread (never blocking)."""

    def poll(self) -> list[TimedStep]: ...

    def finish(self) -> list[TimedStep]: ...


class DeviceEvent(Protocol):
    """The part of `torch.cuda.Event(enable_timing=True)` the timer reads."""

    def query(self) -> bool: ...

    def elapsed_time(self, end_event: Any) -> float: ...  # milliseconds


@dataclass(frozen=True)
class DeviceCalls:
    """The CUDA calls of a step boundary (`cuda_calls`; tests pass fakes).

    `new_event()`: a timing event (`torch.cuda.Event(enable_timing=True)`; the CUDA event is
    created at its first record). `record(event, stream)`: record `event` on `stream` (the C
    binding, no Python frame). `raw_stream()`: the current stream's handle on the agent's device
    (an int, cheap: no object built). `stream()`: the current stream as `record` takes it (built;
    asked again only when `raw_stream()` changes)."""

    new_event: Callable[[], Any]
    record: Callable[[Any, Any], None]
    raw_stream: Callable[[], int]
    stream: Callable[[], Any]


def cuda_calls(device_index: int) -> DeviceCalls:
    """`DeviceCalls` of CUDA device `device_index` (imports torch; needs a CUDA build)."""
    import torch

    return DeviceCalls(
        new_event=functools.partial(torch.cuda.Event, enable_timing=True),
        record=torch._C._CudaEventBase.record,
        raw_stream=functools.partial(torch._C._cuda_getCurrentRawStream, device_index),
        stream=functools.partial(torch.cuda.current_stream, device_index),
    )


class DeviceEventStepTimer:
    """Step periods measured between the device events the step recorder records, read
    asynchronously (the module docstring says who does what).

    `max_pending` bounds the steps awaiting their events; if the device falls that far behind
    (it cannot on a normal CUDA queue, which blocks the host long before), the periodic thread
    drops the oldest and counts them in `dropped_steps`. `close_wait_s`: how long `finish` waits
    for the device to pass the last step (it polls; steps it is not past by then are dropped).
    `clock_ns`: the recorder's clock; `wall_clock_ns`: the wall clock the steps' starts are
    given in (their difference is read at each poll, as the host periods' is).
    """

    def __init__(
        self,
        calls: DeviceCalls,
        max_pending: int = 64,
        close_wait_s: float = 2.0,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
        clock_ns: Callable[[], int] = time.perf_counter_ns,
        wall_clock_ns: Callable[[], int] = time.time_ns,
    ) -> None:
        self.calls = calls
        self._max_pending = max_pending
        self._close_wait_s = close_wait_s
        self._clock = clock
        self._sleep = sleep
        self._clock_ns = clock_ns
        self._wall_clock_ns = wall_clock_ns
        self.pool: collections.deque[Any] = collections.deque()  # spent start events
        self._recorder: StepRecorder | None = None
        self._next = 0  # the first step (a count of steps begun) whose period is not given
        self.dropped_steps = 0

    def attach(self, recorder: StepRecorder) -> None:
        """The recorder whose rings (`starts`, `events`) and `end_event` this timer reads."""
        self._recorder = recorder

    # --- periodic thread -----------------------------------------------------------------------

    def poll(self) -> list[TimedStep]:
        """Steps whose next-step start event the device has passed; never blocks."""
        recorder = self._recorder
        if recorder is None:
            return []
        begun = recorder.begun  # read first: the slots of the steps before it are written
        done, spent = self._periods(recorder, begun)
        while begun - self._next > self._max_pending:
            self._next += 1  # still pending on the device: its event is never reused
            self.dropped_steps += 1
        return self._keep_unwritten(recorder, done, spent)

    def finish(self) -> list[TimedStep]:
        """At close, after the last step: wait (polling, at most `close_wait_s`) for the device
        to pass the last step, then close every step (the last at its end)."""
        recorder = self._recorder
        if recorder is None:
            return []
        begun = recorder.begun
        if self._next >= begun:
            return []
        if recorder.depth == 0:  # the last step ended: its end event marks it
            last = recorder.end_event
        else:  # it never ended: it ends now
            last = self.calls.new_event()
            self.calls.record(last, self.calls.stream())
        deadline = self._clock() + self._close_wait_s
        while not last.query() and self._clock() < deadline:
            self._sleep(0.001)
        done, spent = self._periods(recorder, begun, last=last)
        self.dropped_steps += begun - self._next  # those the device had not passed
        self._next = begun
        return self._keep_unwritten(recorder, done, spent)

    def _periods(
        self, recorder: StepRecorder, begun: int, last: Any = None
    ) -> tuple[list[TimedStep], list[tuple[int, Any]]]:
        """The periods the device has passed, from `self._next` on (with `last`: the last
        step's too, up to that event); the start events they spent."""
        events, starts, first = recorder.events, recorder.starts, recorder.first_step
        mask = len(events) - 1
        n = self._next
        if begun - n > len(events):  # the ring was rewritten before it was read
            self.dropped_steps += begun - len(events) - n
            n = begun - len(events)
        offset_ns = self._wall_clock_ns() - self._clock_ns()
        done: list[TimedStep] = []
        spent: list[tuple[int, Any]] = []
        while n < begun:
            start = events[n & mask]
            following = events[(n + 1) & mask] if n + 1 < begun else last
            if following is None and n + 1 == begun:
                break  # the open step: its period comes with the next step's start
            if start is None or following is None:  # a record that failed: not timed
                n += 1
                self.dropped_steps += 1
                continue
            if not (start.query() and following.query()):
                break
            elapsed_s = start.elapsed_time(following) / 1e3
            if elapsed_s < 0:  # a stale end event (its record failed): not this step's end
                self.dropped_steps += 1
            else:
                # at least the shortest step the wire schema takes (events resolve ~0.5 us)
                period_s = max(elapsed_s, MIN_STEP_SECONDS)
                done.append(TimedStep(first + n, starts[n & mask] + offset_ns, period_s))
                spent.append((n, start))
            n += 1
        self._next = n
        return done, spent

    def _keep_unwritten(
        self, recorder: StepRecorder, done: list[TimedStep], spent: list[tuple[int, Any]]
    ) -> list[TimedStep]:
        """Drop (and count) the steps whose slots the training thread may have rewritten while
        they were read (slot n is rewritten when step n + the ring's size begins); their events
        may be in use again, so only the others go back to the pool."""
        limit = recorder.begun - len(recorder.events)
        first = recorder.first_step
        kept = [t for t in done if t.step - first >= limit]
        self.dropped_steps += len(done) - len(kept)
        self.pool.extend(event for n, event in spent if n >= limit)
        return kept
