"""Sampled torch.profiler windows: recording one, analysing it off-thread (when to open one:
`window_schedule`).

The training thread only starts and stops the profiler (and marks each profiled step with a
`ProfilerStep#N` range, N = the agent's step number, which is how the engine finds steps). The
stopped profiler goes to a background thread that exports the Kineto trace to a temporary file,
runs the engine on it, keeps a gzipped copy when asked (`kept_traces`), deletes the file and
leaves the result for the agent to pick up.
"""

from __future__ import annotations

import collections
import contextlib
import os
import queue
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from mfuscope.core.errors import MfuscopeError
from mfuscope.core.step_report import DecompositionLike

__all__ = [
    "Keep",
    "ProfilerBusy",
    "ProfilerLike",
    "WindowAnalyser",
    "WindowOutcome",
    "WindowRecorder",
    "torch_profiler_busy",
    "torch_profiler_factory",
]


class ProfilerLike(Protocol):
    """The part of `torch.profiler.profile` a window uses."""

    def start(self) -> None: ...

    def stop(self) -> None: ...

    def export_chrome_trace(self, path: str) -> Any: ...


def torch_profiler_factory(use_cuda: bool) -> Callable[[], ProfilerLike]:
    """A factory of real profilers: CPU (+ CUDA) activities, shapes on (gloo sizes need them)."""

    def make() -> ProfilerLike:
        import torch.profiler

        activities = [torch.profiler.ProfilerActivity.CPU]
        if use_cuda:
            activities.append(torch.profiler.ProfilerActivity.CUDA)
        profiler: ProfilerLike = torch.profiler.profile(activities=activities, record_shapes=True)
        return profiler

    return make


class ProfilerBusy(MfuscopeError, RuntimeError):
    """The user runs their own profiler: torch allows one at a time, so the window is skipped."""


def torch_profiler_busy() -> bool:
    """Whether a torch profiler is recording in this process (torch's own fast Python flag)."""
    import torch.autograd.profiler as autograd_profiler

    return bool(getattr(autograd_profiler, "_is_profiler_enabled", False))


class WindowRecorder:
    """Drives one profiler over a window of steps on the training thread.

    `busy` says whether another profiler is already recording (then a window is not started).
    """

    def __init__(
        self,
        profiler_factory: Callable[[], ProfilerLike],
        annotate: Callable[[str], contextlib.AbstractContextManager[Any]] | None = None,
        busy: Callable[[], bool] | None = None,
    ) -> None:
        self._factory = profiler_factory
        self._annotate = annotate or _record_function
        self._busy = busy or (lambda: False)
        self._profiler: ProfilerLike | None = None
        self._range: contextlib.AbstractContextManager[Any] | None = None

    @property
    def active(self) -> bool:
        return self._profiler is not None

    def begin_step(self, step: int, *, first: bool) -> None:
        """Start the profiler (first window step) and open the step's `ProfilerStep#N` range."""
        if first:
            if self._busy():
                raise ProfilerBusy("another torch.profiler session is active")
            profiler = self._factory()
            self._profiler = profiler  # set first: abort() must stop a half-started profiler
            profiler.start()
        if self._profiler is None:
            raise RuntimeError("no profiler window is open")
        annotation = self._annotate(f"ProfilerStep#{step}")
        annotation.__enter__()
        self._range = annotation

    def end_step(self, *, last: bool) -> ProfilerLike | None:
        """Close the step's range; on the last window step stop and return the profiler."""
        annotation, self._range = self._range, None
        if annotation is not None:
            annotation.__exit__(None, None, None)
        if not last:
            return None
        profiler, self._profiler = self._profiler, None
        if profiler is not None:
            profiler.stop()
        return profiler

    def abort(self) -> None:
        """Best-effort teardown after a failure; never raises."""
        annotation, self._range = self._range, None
        profiler, self._profiler = self._profiler, None
        with contextlib.suppress(Exception):
            if annotation is not None:
                annotation.__exit__(None, None, None)
        with contextlib.suppress(Exception):
            if profiler is not None:
                profiler.stop()


def _record_function(name: str) -> contextlib.AbstractContextManager[Any]:
    import torch.profiler

    context: contextlib.AbstractContextManager[Any] = torch.profiler.record_function(name)
    return context


@dataclass(frozen=True)
class WindowOutcome:
    """What one window produced: the decompositions of its steps, or the error that stopped it.

    `cpu_s` is the CPU time the background thread spent on it (export + analysis + keeping).
    `kept_trace`: where its trace was kept (None: not kept); `keep_error`: why keeping failed.
    """

    steps: tuple[int, ...]
    decompositions: tuple[DecompositionLike, ...] = ()
    error: str | None = None
    cpu_s: float = 0.0
    kept_trace: str | None = None
    keep_error: str | None = None


Analyse = Callable[[str], Sequence[DecompositionLike]]
# (exported trace path, window steps) -> where it was kept; raises OSError when it cannot be.
Keep = Callable[[str, tuple[int, ...]], Any]
# Told of each analysed window on the analyser thread (window steps, their decompositions); the
# agent logs a line. Must not raise.
OnAnalysed = Callable[[Sequence[int], Sequence[DecompositionLike]], None]


def _drop_events(profiler: object) -> None:
    """Free a stopped torch profiler's events now. `torch.profiler.profile` is a reference cycle
    (its action map holds its own bound methods), so dropping the last reference frees nothing
    until a full garbage collection, minutes later or never; its events (180 MB of a 400-layer
    MLP's 3-step window) sit in the autograd profiler under its `profiler` attribute."""
    fields = getattr(profiler, "__dict__", {})
    if "profiler" in fields:
        fields["profiler"] = None


def release_heap() -> None:
    """Hand the C heap's free memory back to the system (glibc's `malloc_trim`; elsewhere
    nothing): freed, a window's events stay in glibc's arenas, and the training process would
    carry them to its end (benchmarks/after_window.py prints the resident memory)."""
    import ctypes

    try:
        trim = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):
        return
    trim(0)


class WindowAnalyser:
    """One daemon thread, started with the first window: export the stopped profiler's trace,
    analyse it, delete the file. A failure anywhere in that is the window's outcome (an error:
    the coordinator drops the window, counts and logs it), never the thread's end.

    `export` runs the first part (export, then free the profiler's events and the heap) on the
    calling thread instead, for `submit` to take the exported file: exporting and freeing hold
    the GIL for their whole length, and trimming the heap the allocator's locks (on a 12 MB CPU
    trace under load, a thread running Python stalled 400 ms in the export and 700 ms in the
    free; one allocating tensors, 170 ms in the trim). On the analyser thread that stall lands
    on the training thread's steps after the window, where on CPU timelines it reads as their
    own blocked time (docs/definitions.md#carried-breakdowns); on the training thread, at the
    window's last step, it is that step's `instrumentation`."""

    def __init__(
        self,
        analyse: Analyse,
        *,
        temp_dir: str | None = None,
        thread_time: Callable[[], float] = time.thread_time,
        keep: Keep | None = None,
        on_analysed: OnAnalysed | None = None,
    ) -> None:
        self._analyse = analyse
        self._keep = keep
        self._on_analysed = on_analysed
        self._temp_dir = temp_dir
        self._thread_time = thread_time
        self._jobs: queue.Queue[tuple[ProfilerLike | str, tuple[int, ...]] | None] = queue.Queue()
        # Outcomes, oldest first: appended here, popped by `poll` on the training thread without
        # a lock (a deque's append and popleft are atomic under the GIL); `_arrived` wakes `wait`.
        self._results: collections.deque[WindowOutcome] = collections.deque()
        self._arrived = threading.Event()
        self._busy = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def busy(self) -> bool:
        return self._busy.is_set()

    def export(self, profiler: ProfilerLike) -> str:
        """Export a stopped profiler's trace to a temporary file (its path), then free its events
        and the heap, here; raises what the export raised (the file is removed)."""
        fd, path = tempfile.mkstemp(prefix="mfuscope-window-", suffix=".json", dir=self._temp_dir)
        os.close(fd)
        try:
            profiler.export_chrome_trace(path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.remove(path)
            raise
        finally:
            _drop_events(profiler)
            release_heap()
        return path

    def submit(self, profiler: ProfilerLike | str, steps: tuple[int, ...]) -> None:
        """Analyse a window: a stopped profiler, or the trace `export` wrote for it (the
        analyser removes the file)."""
        self._busy.set()
        self._jobs.put((profiler, steps))
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="mfuscope-analyser", daemon=True)
            self._thread.start()

    @property
    def ready(self) -> bool:
        """Whether an outcome waits to be picked up (a plain read: no lock, never blocks)."""
        return bool(self._results)

    def poll(self) -> WindowOutcome | None:
        try:
            return self._results.popleft()
        except IndexError:
            return None

    def wait(self, timeout_s: float) -> WindowOutcome | None:
        deadline = time.monotonic() + max(timeout_s, 0.0)
        while True:
            self._arrived.clear()
            outcome = self.poll()
            if outcome is not None:
                return outcome
            left = deadline - time.monotonic()
            if left <= 0 or not self._arrived.wait(left):
                return self.poll()

    def close(self, timeout_s: float) -> None:
        self._jobs.put(None)
        if self._thread is not None:
            self._thread.join(max(timeout_s, 0.0))

    def _run(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                return
            profiler, steps = job
            del job
            outcome = self._outcome(profiler, steps)
            if not isinstance(profiler, str):
                _drop_events(profiler)
                del profiler
                release_heap()
            if self._on_analysed is not None and outcome.decompositions:
                self._on_analysed(outcome.steps, outcome.decompositions)  # its own guard
            self._busy.clear()
            self._results.append(outcome)
            self._arrived.set()

    def _outcome(self, profiler: ProfilerLike | str, steps: tuple[int, ...]) -> WindowOutcome:
        """The window's outcome; any failure (export, keeping, analysis) is its error."""
        started = self._thread_time()
        kept: list[str | None] = [None, None]  # (kept path, keep error)
        try:
            decompositions = tuple(self._export_and_analyse(profiler, steps, kept))
            error = None
        except Exception as exc:
            decompositions, error = (), f"{type(exc).__name__}: {exc}"
        return WindowOutcome(
            steps=steps,
            decompositions=decompositions,
            error=error,
            cpu_s=max(self._thread_time() - started, 0.0),
            kept_trace=kept[0],
            keep_error=kept[1],
        )

    def _export_and_analyse(
        self, profiler: ProfilerLike | str, steps: tuple[int, ...], kept: list[str | None]
    ) -> Sequence[DecompositionLike]:
        if isinstance(profiler, str):
            path = profiler
        else:
            fd, path = tempfile.mkstemp(
                prefix="mfuscope-window-", suffix=".json", dir=self._temp_dir
            )
            os.close(fd)
        try:
            if not isinstance(profiler, str):
                profiler.export_chrome_trace(path)
            if self._keep is not None:  # before the analysis: a trace it fails on is kept too
                try:
                    kept[0] = str(self._keep(path, steps))
                except OSError as exc:
                    kept[1] = f"{type(exc).__name__}: {exc}"
            return self._analyse(path)
        finally:
            with contextlib.suppress(OSError):
                os.remove(path)
