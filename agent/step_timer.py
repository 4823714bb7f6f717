"""Step wall time, every step, without slowing the step down.

A step's wall time is the *period* from its start to the next step's start, the same window the
engine uses on the device timeline (docs/definitions.md#step-window): time spent between two
`with agent.step()` blocks (data loading, logging) belongs to the step before it, as bubble. The
last step ends at its own end.

- CPU: a monotonic clock read at each step boundary.
- GPU: a CUDA event recorded on the current stream at each step boundary; events are read with
  the non-blocking `query()` a few steps later, once the device has passed them, and
  `elapsed_time` gives the device-side period. No host synchronisation on the training path.
  The CUDA side sits behind `DeviceEvent`, so tests can fake it.
"""

from __future__ import annotations

import collections
import itertools
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

__all__ = [
    "DeviceEvent",
    "DeviceEventStepTimer",
    "HostStepTimer",
    "StepTimer",
    "TimedStep",
]


@dataclass(frozen=True)
class TimedStep:
    """One finished step: its number, host wall-clock start (ns since epoch), period (s)."""

    step: int
    start_unix_ns: int
    wall_s: float


class StepTimer(Protocol):
    def begin(self, step: int) -> None: ...

    def end(self, step: int) -> None: ...

    def poll(self) -> list[TimedStep]: ...

    def finish(self) -> list[TimedStep]: ...


class HostStepTimer:
    """Step periods from a monotonic clock (seconds) on the calling thread."""

    def __init__(
        self,
        clock: Callable[[], float] = time.perf_counter,
        wall_clock_ns: Callable[[], int] = time.time_ns,
    ) -> None:
        self._clock = clock
        self._wall_clock_ns = wall_clock_ns
        self._open: tuple[int, int, float] | None = None  # step, start unix ns, start clock
        self._end: float | None = None
        self._done: list[TimedStep] = []

    def begin(self, step: int) -> None:
        now = self._clock()
        if self._open is not None:
            self._close_open(now)
        self._open = (step, self._wall_clock_ns(), now)
        self._end = None

    def end(self, step: int) -> None:
        self._end = self._clock()

    def poll(self) -> list[TimedStep]:
        done, self._done = self._done, []
        return done

    def finish(self) -> list[TimedStep]:
        """Close the last step at its own end (or now, if it never ended)."""
        if self._open is not None:
            self._close_open(self._end if self._end is not None else self._clock())
        return self.poll()

    def _close_open(self, until: float) -> None:
        assert self._open is not None
        step, start_ns, start = self._open
        self._done.append(TimedStep(step, start_ns, max(until - start, 1e-9)))
        self._open = None


class DeviceEvent(Protocol):
    """The part of `torch.cuda.Event(enable_timing=True)` the timer uses."""

    def record(self) -> None: ...

    def query(self) -> bool: ...

    def elapsed_time(self, end_event: DeviceEvent) -> float: ...  # milliseconds

    def synchronize(self) -> None: ...


class DeviceEventStepTimer:
    """Step periods measured between device events, read asynchronously.

    `max_pending` bounds the steps awaiting their events; if the device falls that far behind
    (it cannot on a normal CUDA queue, which blocks the host long before), the oldest are
    dropped and counted in `dropped_steps`.
    """

    def __init__(
        self,
        new_event: Callable[[], DeviceEvent],
        wall_clock_ns: Callable[[], int] = time.time_ns,
        max_pending: int = 64,
    ) -> None:
        self._new_event = new_event
        self._wall_clock_ns = wall_clock_ns
        self._max_pending = max_pending
        # (step, host start unix ns, start event), oldest first; the last one is still open.
        self._starts: collections.deque[tuple[int, int, DeviceEvent]] = collections.deque()
        self._end: DeviceEvent | None = None
        self.dropped_steps = 0

    def begin(self, step: int) -> None:
        event = self._new_event()
        event.record()
        self._starts.append((step, self._wall_clock_ns(), event))
        self._end = None
        while len(self._starts) > self._max_pending:
            self._starts.popleft()
            self.dropped_steps += 1

    def end(self, step: int) -> None:
        event = self._new_event()
        event.record()
        self._end = event

    def poll(self) -> list[TimedStep]:
        """Steps whose next-step start event the device has passed; never blocks."""
        done: list[TimedStep] = []
        while len(self._starts) >= 2:
            step, start_ns, start = self._starts[0]
            following = self._starts[1][2]
            if not following.query():
                break
            self._starts.popleft()
            done.append(TimedStep(step, start_ns, _elapsed_s(start, following)))
        return done

    def finish(self) -> list[TimedStep]:
        """At close only: wait for the device, then close every step (the last at its end)."""
        done: list[TimedStep] = []
        if self._starts:
            last = self._end if self._end is not None else self._new_event()
            if self._end is None:
                last.record()
            last.synchronize()
            events = [*self._starts, (-1, 0, last)]
            for (step, start_ns, start), (_, _, following) in itertools.pairwise(events):
                done.append(TimedStep(step, start_ns, _elapsed_s(start, following)))
            self._starts.clear()
        return done


def _elapsed_s(start: DeviceEvent, end: DeviceEvent) -> float:
    return max(start.elapsed_time(end) / 1e3, 1e-9)
