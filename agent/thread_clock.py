"""The training thread's own clock on CPU timelines: how long it was blocked in each step.

A step's period on the host is the training thread's CPU time, plus the time it waited for a
CPU while runnable (its *run delay*), plus the time it was blocked: off the CPU and not asking
for it (a collective it waits on, a sleep, a queue). On a CPU timeline the steps between profiled
windows carry their exposed communication from that blocked time, step by step
(docs/definitions.md#carried-breakdowns); this module reads the two figures it takes at each
step's start:

- CPU time: `time.thread_time_ns()` (exact for the calling thread);
- run delay: the second field of Linux's ``/proc/thread-self/schedstat`` (ns). Its first field,
  the CPU time, lags by up to a scheduler tick for the thread reading its own, hence the first
  figure; the run delay accrues only while the thread waits to run, so the thread reading it
  sees it current.

The file is opened on the training thread (``thread-self`` names the opener's thread) and read
with one `pread`; the bytes are parsed later, on the agent's periodic thread. Where the file is
missing (not Linux, a kernel without schedstats) there is no reader and steps carry the window's
shares, as on GPU timelines, where the device, not the training thread, spans the wait.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable

__all__ = ["RunDelayReader", "open_run_delay", "run_delay_ns"]

SCHEDSTAT = "/proc/thread-self/schedstat"


class RunDelayReader:
    """Reads the opening thread's schedstat line (`read`, raw bytes; parse with `run_delay_ns`).

    Holds the file open for the reader's life: the hot path calls `read` with no check, so the
    descriptor is closed only when nothing can call it any more (the recorder that holds both
    the reader and its `read` is collected)."""

    __slots__ = ("_fd", "read")

    def __init__(self, fd: int) -> None:
        self._fd = fd
        self.read: Callable[[], bytes] = functools.partial(os.pread, fd, 64, 0)

    def __del__(self) -> None:
        os.close(self._fd)


def open_run_delay(path: str = SCHEDSTAT) -> RunDelayReader | None:
    """A reader of the calling thread's run delay, or None where it cannot be read."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    reader = RunDelayReader(fd)
    try:
        run_delay_ns(reader.read())
    except (OSError, ValueError):
        return None  # the reader closes the file as it goes
    return reader


def run_delay_ns(raw: bytes) -> int:
    """The run delay (ns) in a schedstat line: ``"<cpu ns> <run delay ns> <timeslices>"``."""
    fields = raw.split()
    if len(fields) < 2:
        raise ValueError(f"not a schedstat line: {raw[:64]!r}")
    return int(fields[1])
