"""Step wall time, every step, without slowing the step down or synchronising the device.

A step's wall time is the *period* from its start to the next step's start, the same window the
engine uses on the device timeline (docs/definitions.md#step-window): time spent between two
`with agent.step()` blocks (data loading, logging) belongs to the step before it, as bubble. The
last step ends at its own end.

- CPU: the agent's step recorder (`mfuscope.agent._step_recorder`) reads a monotonic clock at
  each step boundary and the periodic thread turns the readings into periods; no timer object.
- GPU: `DeviceEventStepTimer`, a CUDA event recorded on the current stream at each step start
  (and one reused event at each step end). The periodic thread reads them with the non-blocking
  `query()` once the device has passed them, and `elapsed_time` gives the device-side period.
  It never synchronises the device: not on the training thread, not on the periodic thread, not
  at close (close polls `query()` until its deadline). PyTorch's `CUDAEvent` may be queried and
  timed from any thread and device (`c10/cuda/CUDAEvent.h`); `elapsed_time` of an event not yet
  completed raises rather than waits, and the timer never asks for one. The CUDA side sits behind
  `DeviceEvent`, so tests can fake it.

Threads: `begin` and `end` run on the training thread; `poll` and `finish` on the agent's report
thread (never both at once). They share two deques, each operation on them atomic under the GIL:
the recorded step starts (appended by the training thread, popped by the periodic thread) and a
pool of spent start events (returned by the periodic thread, reused by the training thread), so no
event is created per step once the pool holds a few.
"""

from __future__ import annotations

import collections
import itertools
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from mfuscope.core.schema import MIN_STEP_SECONDS

__all__ = [
    "DeviceEvent",
    "DeviceEventStepTimer",
    "StepTimer",
    "TimedStep",
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
    """Step periods measured on a device: `begin`/`end` on the training thread (cheap, never
    blocking), `poll`/`finish` on the periodic thread."""

    def begin(self, step: int) -> None: ...

    def end(self, step: int) -> None: ...

    def poll(self) -> list[TimedStep]: ...

    def finish(self) -> list[TimedStep]: ...


class DeviceEvent(Protocol):
    """The part of `torch.cuda.Event(enable_timing=True)` the timer uses."""

    def record(self) -> None: ...

    def query(self) -> bool: ...

    def elapsed_time(self, end_event: DeviceEvent) -> float: ...  # milliseconds


class DeviceEventStepTimer:
    """Step periods measured between device events, read asynchronously.

    `max_pending` bounds the steps awaiting their events; if the device falls that far behind
    (it cannot on a normal CUDA queue, which blocks the host long before), the periodic thread
    drops the oldest and counts them in `dropped_steps`. `close_wait_s`: how long `finish` waits
    for the device to pass the last step (it polls; steps it is not past by then are dropped).
    """

    def __init__(
        self,
        new_event: Callable[[], DeviceEvent],
        wall_clock_ns: Callable[[], int] = time.time_ns,
        max_pending: int = 64,
        close_wait_s: float = 2.0,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self._new_event = new_event
        self._wall_clock_ns = wall_clock_ns
        self._max_pending = max_pending
        self._close_wait_s = close_wait_s
        self._clock = clock
        self._sleep = sleep
        # (step, host start unix ns, start event), oldest first; the last one is still open.
        self._starts: collections.deque[tuple[int, int, DeviceEvent]] = collections.deque()
        self._pool: collections.deque[DeviceEvent] = collections.deque()  # spent start events
        self._end: DeviceEvent | None = None  # recorded again at every step end
        self._ended = False  # the latest step ended (its end event marks it)
        self.dropped_steps = 0

    # --- training thread ---------------------------------------------------------------------

    def begin(self, step: int) -> None:
        pool = self._pool
        # Only this thread pops the pool (the periodic thread only appends): a non-empty pool
        # still holds an event at the pop.
        event = pool.pop() if pool else self._new_event()
        event.record()
        self._starts.append((step, self._wall_clock_ns(), event))
        self._ended = False

    def end(self, step: int) -> None:
        event = self._end
        if event is None:
            event = self._end = self._new_event()
        event.record()  # recording again moves it: only the latest step's end is ever read
        self._ended = True

    # --- periodic thread -----------------------------------------------------------------------

    def poll(self) -> list[TimedStep]:
        """Steps whose next-step start event the device has passed; never blocks."""
        done: list[TimedStep] = []
        starts = self._starts
        while len(starts) >= 2:
            step, start_ns, start = starts[0]
            following = starts[1][2]
            if not following.query():
                break
            starts.popleft()
            done.append(TimedStep(step, start_ns, _elapsed_s(start, following)))
            self._pool.append(start)
        while len(starts) > self._max_pending:
            starts.popleft()  # still pending on the device: never reused
            self.dropped_steps += 1
        return done

    def finish(self) -> list[TimedStep]:
        """At close, after the last step: wait (polling, at most `close_wait_s`) for the device
        to pass the last step, then close every step (the last at its end)."""
        starts = self._starts
        if not starts:
            return []
        last = self._end
        if last is None or not self._ended:  # the last step never ended: it ends now
            last = self._new_event()
            last.record()
        deadline = self._clock() + self._close_wait_s
        while not last.query() and self._clock() < deadline:
            self._sleep(0.001)
        done: list[TimedStep] = []
        events = [*starts, (-1, 0, last)]
        for (step, start_ns, start), (_, _, following) in itertools.pairwise(events):
            if start.query() and following.query():
                done.append(TimedStep(step, start_ns, _elapsed_s(start, following)))
            else:
                self.dropped_steps += 1
        starts.clear()
        return done


def _elapsed_s(start: DeviceEvent, end: DeviceEvent) -> float:
    # at least the shortest step the wire schema takes (CUDA events resolve ~0.5 us)
    return max(start.elapsed_time(end) / 1e3, MIN_STEP_SECONDS)
