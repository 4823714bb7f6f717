"""Blocked time the agent can name on the training thread (CPU timelines): a `DataLoader`'s fetch,
and the agent's own profiler start and stop.

A carried step's exposed communication is its blocked time less the blocked time elsewhere
(docs/definitions.md#carried-breakdowns). Blocked time the agent can see the cause of is taken out
first, step by step, so that it never reads as communication:

- **waiting for data**: the time the training thread is blocked inside a
  `torch.utils.data.DataLoader` iterator's `__next__` (a loader that is late: its worker
  processes, its queue, a slow dataset). `install_dataloader` wraps that method; the trace shows
  the same time as idle (`bubble_idle`): nothing runs and no collective is in flight;
- **the agent's own profiler**: on a window's first and last steps the profiler's start and stop
  (and, on CPU timelines, the trace's export: `WindowAnalyser.export`) run on the training thread
  (the `instrumentation` bucket), and block on its threads, files and locks; the window
  coordinator runs them through `KnownWaits.around`.

Each is two readings of the thread's clock (`thread_clock`), one `pread` each, around the call;
the blocked time between them (wall less CPU time less run delay) is added to the step's slot of a
ring the report thread reads (`blocked_s`). Only the thread that opened the clock reads it (the
file names its opener); a fetch on another thread is not measured.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from time import perf_counter_ns
from typing import Any, TypeVar

from mfuscope.agent._step_recorder import CAPACITY
from mfuscope.agent._thread_clock import ThreadTimes, thread_times

__all__ = ["KnownWaits", "install_dataloader"]

_MASK = CAPACITY - 1  # a step's slot is its index modulo the step recorder's ring
_T = TypeVar("_T")


class KnownWaits:
    """Per step, the training thread's blocked time the agent can name (ns, see the module
    docstring). `begun()` is the step recorder's count of steps begun: the step in progress (or
    the latest one, between steps) has index ``begun() - 1``, number ``first_step + index``.
    Written on the training thread, read by the report thread for steps that have ended (a later
    step has begun), so no slot is read while it is written."""

    __slots__ = (
        "_begun",
        "_clock_ns",
        "_data_ns",
        "_depth",
        "_first_step",
        "_ns",
        "_owner",
        "_read",
        "thread",
    )

    def __init__(
        self,
        read: Callable[[], bytes],
        begun: Callable[[], int],
        first_step: int,
        clock_ns: Callable[[], int] = perf_counter_ns,
    ) -> None:
        """Made on the training thread (the one whose clock `read` reads); `clock_ns`: the wall
        clock the blocked time is measured against."""
        self._read = read
        self._clock_ns = clock_ns
        self._begun = begun
        self._first_step = first_step
        self.thread = threading.get_ident()  # the clock's thread: it opened the file
        self._owner = [-1] * CAPACITY  # the step index each slot holds
        self._ns = [0] * CAPACITY  # all the named blocked time
        self._data_ns = [0] * CAPACITY  # the part waiting for data (idle on the trace)
        self._depth = 0  # a measured call inside another (a loader reading a loader) counts once

    def around(self, action: Callable[[], _T], step: int | None = None, data: bool = False) -> _T:
        """Run `action` on the clock's thread and add the time it was blocked to step `step`
        (None: the step in progress); `data`: it was waiting for data. Never raises beyond what
        `action` raises; a failing clock measures nothing."""
        if self._depth or threading.get_ident() != self.thread:
            return action()
        try:
            before, started = self._read(), self._clock_ns()
        except OSError:
            return action()
        self._depth = 1
        try:
            return action()
        finally:
            self._depth = 0
            self._add(before, started, step, data)

    def _add(self, before: bytes, started: int, step: int | None, data: bool) -> None:
        try:
            after, ended = self._read(), self._clock_ns()
            blocked = _blocked_ns(thread_times(before), thread_times(after), ended - started)
        except (OSError, ValueError):
            return
        n = self._begun() - 1 if step is None else step - self._first_step
        if blocked <= 0 or n < 0:
            return
        slot = n & _MASK
        if self._owner[slot] != n:
            self._owner[slot] = n
            self._ns[slot] = self._data_ns[slot] = 0
        self._ns[slot] += blocked
        if data:
            self._data_ns[slot] += blocked

    def blocked_s(self, n: int) -> float:
        """The named blocked time of the step with index `n` (its number less the first step's;
        s, 0 when none was measured)."""
        slot = n & _MASK
        return self._ns[slot] / 1e9 if self._owner[slot] == n else 0.0

    def data_s(self, n: int) -> float:
        """The part of `blocked_s(n)` spent waiting for data (s)."""
        slot = n & _MASK
        return self._data_ns[slot] / 1e9 if self._owner[slot] == n else 0.0


def _blocked_ns(first: ThreadTimes, second: ThreadTimes, wall_ns: int) -> int:
    """The thread's blocked time between two readings `wall_ns` apart: neither on a CPU nor
    waiting for one."""
    return (
        wall_ns - (second.cpu_ns - first.cpu_ns) - max(second.run_delay_ns - first.run_delay_ns, 0)
    )


def install_dataloader(waits: KnownWaits) -> Callable[[], None]:
    """Measure every `DataLoader` fetch on the training thread with `waits` (wraps
    `torch.utils.data.dataloader._BaseDataLoaderIter.__next__`, which every loader's iterator
    uses). Returns a function that restores the original; a no-op where the method is not there
    (another torch) or is already wrapped."""
    try:
        from torch.utils.data import dataloader
    except ImportError:
        return _nothing
    base = getattr(dataloader, "_BaseDataLoaderIter", None)
    original = getattr(base, "__next__", None)
    if base is None or original is None or getattr(original, "_mfuscope_wrapped", False):
        return _nothing

    @functools.wraps(original)
    def __next__(self: Any) -> Any:
        return waits.around(functools.partial(original, self), data=True)

    __next__._mfuscope_wrapped = True  # type: ignore[attr-defined]
    base.__next__ = __next__

    def unwrap() -> None:
        if base.__dict__.get("__next__") is __next__:
            base.__next__ = original

    return unwrap


def _nothing() -> None:
    return None
