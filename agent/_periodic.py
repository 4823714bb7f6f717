"""The agent's periodic thread: one daemon thread, one scheduler, every periodic task.

Reports (`_step_reports`), flight-recorder reads (`collective_reader`), hardware-counter samples
(`hwcounters`) and the window agreement's store calls (`_store_agreement`) each give a `tick`
that does one round of work and returns the seconds until its next round (None: never again).
The thread runs whichever task is due first; a task's tick never runs on two threads at once.
With window analysis (`profiler_windows`, from the first window on) and report shipping
(`transport`, one thread per sink) that makes two to four agent threads per rank.

A tick that raises is the task's bug: it is logged at most once per interval and the task runs
again a second later; the thread and the other tasks go on.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from mfuscope.agent._health import RateLimitedLog

__all__ = ["Periodic", "Task", "adaptive_interval_s"]

# Seconds before a task whose tick raised runs again.
_AFTER_FAILURE_S = 1.0

Tick = Callable[[], float | None]


def adaptive_interval_s(
    written: int, elapsed_s: float, capacity: int, *, max_s: float, min_s: float, share: float
) -> float:
    """The pause (s) before the next read of a ring of `capacity` entries of which `written`
    were written in the last `elapsed_s`: `max_s`, or shorter so that at that rate no more than
    `share` of the ring is written before the next read, but never shorter than `min_s`."""
    if written <= 0 or elapsed_s <= 0:
        return max_s
    return max(min_s, min(max_s, share * capacity * elapsed_s / written))


class Task:
    """One task of a `Periodic` (its fields belong to the scheduler's lock)."""

    __slots__ = ("due", "name", "removed", "tick", "woken")

    def __init__(self, name: str, tick: Tick, due: float) -> None:
        self.name = name
        self.tick = tick
        self.due = due
        self.removed = False
        self.woken = False  # woken while its tick ran: due again at once


class Periodic:
    """Runs tasks on one daemon thread (started with the first task), each when it is due."""

    def __init__(
        self, log: RateLimitedLog, *, name: str = "mfuscope-periodic", clock: Callable[[], float]
    ) -> None:
        self._log = log
        self._name = name
        self._clock = clock
        self._cond = threading.Condition()
        self._tasks: list[Task] = []
        self._running: Task | None = None
        self._stopping = False
        self._thread: threading.Thread | None = None

    def add(self, name: str, tick: Tick, *, delay_s: float = 0.0) -> Task:
        """Run `tick` in `delay_s` seconds, then whenever the pause it returns has passed."""
        task = Task(name, tick, self._clock() + delay_s)
        with self._cond:
            self._tasks.append(task)
            if self._thread is None and not self._stopping:
                self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
                self._thread.start()
            self._cond.notify()
        return task

    def wake(self, task: Task) -> None:
        """Run `task` as soon as the thread is free (again, if it is running now)."""
        with self._cond:
            task.due = min(task.due, self._clock())
            task.woken = True
            self._cond.notify()

    def remove(self, task: Task, timeout_s: float = 1.0) -> None:
        """Never run `task` again; waits at most `timeout_s` for a tick of it in progress."""
        with self._cond:
            task.removed = True
            if threading.current_thread() is not self._thread:
                self._cond.wait_for(lambda: self._running is not task, max(timeout_s, 0.0))

    def stop(self, timeout_s: float = 1.0) -> None:
        """Stop the thread after the tick in progress (waits at most `timeout_s`)."""
        with self._cond:
            self._stopping = True
            self._cond.notify()
            thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(max(timeout_s, 0.0))

    def _next(self) -> Task | None:
        """The next task to run, once it is due; None when stopping."""
        with self._cond:
            while not self._stopping:
                self._tasks = [t for t in self._tasks if not t.removed]
                task = min(self._tasks, key=lambda t: t.due, default=None)
                if task is None:
                    self._cond.wait()
                    continue
                wait = task.due - self._clock()
                if wait <= 0:
                    task.woken = False
                    self._running = task
                    return task
                self._cond.wait(wait)
            return None

    def _run(self) -> None:
        while (task := self._next()) is not None:
            try:
                pause = task.tick()
            except Exception as exc:  # a task's bug: it says so and runs again later
                self._log.warning(
                    f"periodic-{task.name}", "mfuscope: agent error in %s: %r", task.name, exc
                )
                pause = _AFTER_FAILURE_S
            with self._cond:
                self._running = None
                if pause is None:
                    task.removed = True
                elif not task.woken:
                    task.due = self._clock() + pause
                self._cond.notify_all()
