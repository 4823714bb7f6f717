"""The training thread's own clock on CPU timelines: how long it was blocked in each step.

A step's period on the host is the training thread's CPU time, plus the time it waited for a
CPU while runnable (its *run delay*), plus the time it was blocked: off the CPU and not asking
for it (a collective it waits on, a sleep, a queue). On a CPU timeline the steps between profiled
windows carry their exposed communication from that blocked time, step by step
(docs/definitions.md#carried-breakdowns). Linux keeps both figures per thread in
``/proc/thread-self/schedstat``: ``"<CPU time ns> <run delay ns> <timeslices>"``. The training
thread reads its line at each step's start with one `pread` into a ring slot; the periodic thread
parses the lines.

Why one read per step on the training thread, the only system call of its step path
(figures: benchmarks/RESULTS.md#thread-clock):
- one file gives both figures (`time.thread_time_ns` would be a second call, and agrees with the
  line's CPU time to within a scheduler tick);
- read by another thread at its own pace, the per-step figure would be smeared over the steps of
  each interval, and under load a read that lands while the training thread waits for a CPU
  would count that wait as blocked: the carried exposed comm is further off;
- the cost: one system call per step, microseconds on CPU steps of milliseconds. `os.pread` also
  lets other Python threads take the GIL for its duration, so their work (a flight-recorder
  read) can land inside the step boundary instead of later in the step. `thread_clock=False`
  turns the clock off.

The file is opened on the training thread (``thread-self`` names the opener's thread). Where it
is missing (not Linux) or counts nothing (a kernel without scheduler statistics writes
``0 0 0``) there is no clock, and steps carry the window's shares, as on GPU timelines, where
the device, not the training thread, spans the wait.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["SCHEDSTAT", "ThreadClock", "ThreadTimes", "open_thread_clock", "thread_times"]

SCHEDSTAT = "/proc/thread-self/schedstat"


class ThreadClock:
    """Reads the opening thread's schedstat line (`read`, raw bytes; parse with `thread_times`).

    Holds the file open for the clock's life: the hot path calls `read` with no check, so the
    descriptor is closed only when nothing can call it any more (the recorder that holds both
    the clock and its `read` is collected)."""

    __slots__ = ("_fd", "read")

    def __init__(self, fd: int) -> None:
        self._fd = fd
        self.read: Callable[[], bytes] = functools.partial(os.pread, fd, 64, 0)

    def __del__(self) -> None:
        os.close(self._fd)


@dataclass(frozen=True, slots=True)
class ThreadTimes:
    """A schedstat line: the thread's CPU time and run delay so far (ns)."""

    cpu_ns: int
    run_delay_ns: int


def open_thread_clock(path: str = SCHEDSTAT) -> ThreadClock | None:
    """The calling thread's clock, or None where it cannot be read or counts nothing."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    clock = ThreadClock(fd)  # closes the file when collected, also on the way out below
    try:
        times = thread_times(clock.read())
    except (OSError, ValueError):
        return None
    return clock if times.cpu_ns > 0 else None


def thread_times(raw: bytes) -> ThreadTimes:
    """Parse a schedstat line (ValueError if it is not one)."""
    fields = raw.split()
    if len(fields) < 2:
        raise ValueError(f"not a schedstat line: {raw[:64]!r}")
    return ThreadTimes(int(fields[0]), int(fields[1]))
