"""The training thread's side of the agent: the context manager `agent.step()` returns, and
the per-iteration marker behind `agent.mark_step()`.

What the hot path may do
------------------------
On a *steady* step (the common case: no profiled window starts, records or awaits its analysis
on it, no window decision is due, no FLOP count starts, and the step's forward shapes match the
steady ones), `StepRecorder.__enter__` and `__exit__` together, or one `mark` (which ends the
marked step before and begins the next at one instant), may only:

- read `time.perf_counter_ns()` once per boundary (`__enter__`: the step's start, `__exit__`:
  its end; `mark`: both at once);
- store the start in a preallocated ring slot (`starts[n % CAPACITY]`), the end and the count of
  steps begun (`begun`, which publishes the slot) in this object's slots;
- reset and compare a few ints of this object: the nesting depth, the step from which the slow
  path is due (`slow_from`), the count of the step's forwards that matched the steady shapes
  (`forwards_matched`, kept by the model's forward pre-hook, `step_flops.FlopsTracker`);
- on a GPU, record one CUDA event per boundary, inline (`_device_marks` says how, `step_timer`
  why these calls): at a step's start one popped from a pool (`event_pool.pop()`) into a second
  ring slot (`events`), after comparing the current stream's handle (`raw_stream()`, an int) with
  the held stream's; at a `with` step's end one reused event (`end_event`). No `Stream` object
  per step, no Python frame of torch's or the timer's, never a synchronisation;
- on a CPU timeline (no device timer), also store the thread's schedstat line in a second ring
  slot (`thread_clock`: one `pread` of /proc, the one system call of the path; its module says
  why per step), from which the periodic thread works out how long the step was blocked.

Nothing else: no lock, no allocation besides the clock's int and that line (on GPU: the stream
handle's int, a cached small int on the default stream), no logging call, no dictionary, no
report, no wall-clock read, no call into the rest of the agent. The periodic thread
(`_step_reports`; on GPU `step_timer.DeviceEventStepTimer`) does the rest: periods, wall-clock
starts, FLOPs, reports, the collective reader's step starts, the window coordinator's baseline.
Tested on CPU and on the device path with fake CUDA calls (tests/unit/agent/test_hot_path.py);
`mfuscope validate-gpu` runs the same probe on a GPU.

A marked step (`depth == MARKED`) ends at the next `mark`, a `with agent.step()` block, a phase
between steps or `close()` (`end_marked`); a `mark` inside a `with` block is ignored (logged
once), as a nested step is; FLOPs given to a mark (`mark_given`) stay with its step.

The hot path is Python: after a DDP step every cold Python frame and attribute costs memory
lines, and the target is an in-agent median under twice the floor's (docs/agent.md, "Overhead";
figures: benchmarks/RESULTS.md#agent-overhead). A C twin would save a few microseconds per step,
which no training step notices; one hot path that mypy checks and the tests run is worth more.

The slow path (`_begin_slow`, `_end_slow`) is taken by the steps that need more: the first one
(FLOPs counted), the steps that open or belong to a profiled window or wait for its analysis (the
profiler starts and stops on the steps that take the window), decision steps of the window
schedule, steps given their own FLOPs, nested or failing steps, a switch between the marker and
`with` blocks, and a step whose forward shapes changed. All of them but the last are known
before the step begins (`slow_from`, set by the previous slow step); the forward hook sees the
last during the step.

Why the ring needs no lock
--------------------------
One producer (the training thread) and one consumer (the periodic thread; at close, the closing
thread once the periodic thread has stopped). In CPython each bytecode runs under the GIL, a list
item store and an attribute store are single bytecodes, and handing the GIL from one thread to
another orders memory: a consumer that reads `begun == n + 1` sees everything the producer stored
before it published that value (the start of step n, and what every earlier step logged). The
producer overwrites slot n only when step n + CAPACITY begins; the consumer re-reads `begun` after
reading slots and drops (and counts) those the producer may have reached. The few records slow
steps pass on (their FLOPs, their window membership, window results) go through deques, whose
append and popleft are atomic under the GIL. This relies on the GIL: free-threaded CPython builds
are not supported.
"""

from __future__ import annotations

import collections
from collections.abc import Callable
from threading import get_ident
from time import perf_counter_ns
from types import TracebackType
from typing import TYPE_CHECKING, Any

from mfuscope.agent._device_marks import (
    attach_device,
    device_end,
    device_failed,
    device_start,
    stream_changed,
)
from mfuscope.agent._health import HealthCounters, RateLimitedLog
from mfuscope.agent._step_flops import NO_STEADY, OUTSIDE, RECORDING, StepFlopsValue
from mfuscope.agent._thread_clock import ThreadClock
from mfuscope.agent.step_timer import DeviceEventStepTimer

if TYPE_CHECKING:
    from mfuscope.agent._step_flops import FlopsTracker
    from mfuscope.agent._window_coordinator import WindowCoordinator, WindowResult

__all__ = ["CAPACITY", "MARKED", "GivenStep", "StepRecorder"]

# Steps the ring holds (a power of two). The periodic thread reads it at least every 0.1 s, and
# sooner when steps come fast enough to fill a quarter of it in that time: it falls a whole ring
# behind only when steps come faster than it builds their reports (tens of microseconds each).
CAPACITY = 4096
_MASK = CAPACITY - 1
# `slow_from` when no slow step is planned.
_NEVER = 1 << 62
# `depth` while a step begun by `mark` is open (a `with` step nests from 1 up).
MARKED = -1

# (step, its FLOPs or None when they are not known, the steady FLOPs after it)
FlopsEntry = tuple[int, StepFlopsValue | None, StepFlopsValue | None]


class StepRecorder:
    """The training thread's step recorder: the hot path (`__enter__`, `__exit__`), its
    set-up and the slow path. Slots: the hot path reads its fields from the object itself."""

    __slots__ = (
        "_flops",
        "_health",
        "_log",
        "_windows",
        "begun",
        "clock_thread",
        "closed",
        "current_stream",
        "depth",
        "end_event",
        "event_pool",
        "events",
        "first_step",
        "flops_log",
        "forwards_matched",
        "last_end_ns",
        "marked_given",
        "new_event",
        "phase_log",
        "raw_stream",
        "read_thread_clock",
        "record_event",
        "slow_from",
        "starts",
        "steady_forwards",
        "stream",
        "stream_handle",
        "thread_clock",
        "thread_starts",
        "timer",
        "window_results",
        "window_steps",
    )
    begun: int  # steps begun; step `first_step + n` has ring slot `n % CAPACITY`
    # nesting of `with agent.step()` (only the outermost one is a step); MARKED: a marked step
    depth: int
    first_step: int
    forwards_matched: int  # kept by the model's forward pre-hook (step_flops.ForwardCounts)
    last_end_ns: int  # perf_counter_ns at the latest step's end
    slow_from: int  # the first step (as a count of steps begun) that takes the slow path
    starts: list[int]  # perf_counter_ns at each step's start (the ring)
    steady_forwards: int
    timer: DeviceEventStepTimer | None  # device timer (GPU), None on CPU
    # GPU only (`_device_marks`): each step's start event (a ring beside `starts`; None: its
    # record failed), the `with` steps' end event, the pool, the CUDA calls, the stream and
    # its handle (None: not fetched yet).
    events: list[Any]
    end_event: Any
    event_pool: collections.deque[Any]
    new_event: Callable[[], Any]
    record_event: Callable[[Any, Any], None]
    raw_stream: Callable[[], int]
    current_stream: Callable[[], Any]
    stream: Any
    stream_handle: int | None
    marked_given: StepFlopsValue | None  # the FLOPs given to the open marked step
    # CPU timelines: the training thread's schedstat line at each step's start (a ring beside
    # `starts`); `read_thread_clock` None: not read (GPU, or no schedstat here).
    thread_clock: ThreadClock | None
    read_thread_clock: Callable[[], bytes] | None
    clock_thread: int  # the thread that made the recorder (and opened `thread_clock`)
    thread_starts: list[bytes]
    closed: bool
    flops_log: collections.deque[FlopsEntry]
    window_steps: collections.deque[int]
    window_results: collections.deque[tuple[int, WindowResult]]
    # (start ns, end ns, ledger category) of each phase, appended at its end (`_phases`)
    phase_log: collections.deque[tuple[int, int, str]]
    _flops: FlopsTracker | None
    _windows: WindowCoordinator | None
    _health: HealthCounters
    _log: RateLimitedLog

    def __init__(
        self,
        *,
        first_step: int,
        timer: DeviceEventStepTimer | None,
        health: HealthCounters,
        log: RateLimitedLog,
        thread_clock: ThreadClock | None = None,
    ) -> None:
        """`thread_clock`: the training thread's clock (`thread_clock.open_thread_clock`, opened
        on that thread; CPU timelines only), None: the thread's clock is not read."""
        self.forwards_matched = OUTSIDE
        self.steady_forwards = NO_STEADY
        self.begun = 0
        self.starts = [0] * CAPACITY
        self.last_end_ns = 0
        self.depth = 0
        self.slow_from = 0  # the first step is slow (FLOPs counted, first window decision)
        self.timer = timer
        self.events = [None] * CAPACITY
        self.stream = self.stream_handle = None
        self.marked_given = None
        if timer is not None:
            attach_device(self, timer)
        self.thread_clock = thread_clock
        self.read_thread_clock = None if thread_clock is None else thread_clock.read
        self.clock_thread = get_ident()
        self.thread_starts = [b""] * CAPACITY
        self.first_step = first_step
        self.closed = False
        # Passed on to the periodic thread by slow steps only (deques: see the module docstring).
        self.flops_log = collections.deque()
        self.window_steps = collections.deque()  # steps recorded in a window
        # (the step at whose end a window result came in, the result): it applies from that
        # step's report on (earlier steps keep the breakdown they had).
        self.window_results = collections.deque()
        self.phase_log = collections.deque()  # phases (`agent.phase`), for the job-time ledger
        self._flops = None
        self._windows = None
        self._health = health
        self._log = log

    # --- the hot path ----------------------------------------------------------------------------

    def __enter__(self) -> StepRecorder:
        n = self.begun
        if self.depth or n >= self.slow_from:
            self._begin_slow(None)
            return self
        start = perf_counter_ns()  # first: a step whose start cannot be read is not begun
        self.depth = 1
        self.forwards_matched = 0
        self.starts[n & 4095] = start  # CAPACITY - 1 as a literal: no global lookup
        if self.timer is not None:
            # The step's start event, inlined (no frame; the same in `mark`, `device_start`).
            try:  # free unless it raises (CPython 3.11+)
                pool = self.event_pool
                event = self.events[n & 4095] = pool.pop() if pool else self.new_event()
                if (handle := self.raw_stream()) != self.stream_handle:
                    stream_changed(self, handle)
                self.record_event(event, self.stream)
            except Exception as exc:
                device_failed(self, n, exc)
        elif self.read_thread_clock is not None:
            try:
                self.thread_starts[n & 4095] = self.read_thread_clock()
            except OSError as exc:
                self._thread_clock_failed(exc)
        self.begun = n + 1
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        # Returns None: never swallows the training loop's own exceptions.
        now = perf_counter_ns()
        if exc_type is not None or self.depth != 1 or self.forwards_matched != self.steady_forwards:
            self._end_slow(now, failed=exc_type is not None, given=None)
            return
        if self.timer is not None:
            try:  # the step's end event, on its start's stream (the same in `device_end`)
                self.record_event(self.end_event, self.stream)
            except Exception as exc:
                self.internal_error("timer", exc)
        self.last_end_ns = now
        self.forwards_matched = OUTSIDE
        self.depth = 0

    def mark(self) -> None:
        """`agent.mark_step()`: end the marked step before (if any) and begin the next one, at
        one clock reading (the module docstring says what a steady mark may do)."""
        now = perf_counter_ns()  # first: a step whose start cannot be read is not begun
        # MARKED as a literal (no global lookup); a step that began on the slow path, or whose
        # shapes changed, ends on it
        if (self.depth != -1 or self.forwards_matched != self.steady_forwards) and (
            not self._end_before_mark(now)
        ):
            return
        n = self.begun
        if n >= self.slow_from:
            self._begin_marked(now, None)
            return
        self.last_end_ns = now  # the step before ends where this one starts
        self.forwards_matched = 0
        self.starts[n & 4095] = now
        if self.timer is not None:
            try:  # this step's start event, which also marks the end of the step before
                pool = self.event_pool
                event = self.events[n & 4095] = pool.pop() if pool else self.new_event()
                if (handle := self.raw_stream()) != self.stream_handle:
                    stream_changed(self, handle)
                self.record_event(event, self.stream)
            except Exception as exc:
                device_failed(self, n, exc)
        elif self.read_thread_clock is not None:
            try:
                self.thread_starts[n & 4095] = self.read_thread_clock()
            except OSError as exc:
                self._thread_clock_failed(exc)
        self.begun = n + 1

    def mark_given(self, given: StepFlopsValue) -> None:
        """`agent.mark_step(flops=...)`: as `mark`; the step begun has the FLOPs `given`."""
        now = perf_counter_ns()
        if self._end_before_mark(now):
            self._begin_marked(now, given)

    def bind(self, flops: FlopsTracker, windows: WindowCoordinator) -> None:
        """Attach the parts the slow path drives (they are built with this recorder)."""
        self._flops, self._windows = flops, windows
        # The steady FLOPs before any step ended (given, unknown, or none until counted).
        self.flops_log.append((self.first_step - 1, None, flops.steady_value))
        self._plan(self.first_step - 1)

    @property
    def next_step(self) -> int:
        """The number the next step will have."""
        return self.first_step + self.begun

    def _thread_clock_failed(self, exc: BaseException) -> None:
        """Stop reading the thread's clock (steps from here on carry the window's shares)."""
        self.read_thread_clock = None
        self.thread_clock = None
        self._log.warning(
            "thread-clock",
            "mfuscope: the training thread's clock is not read any more (%s); steps between "
            "profiled windows carry the window's shares",
            exc,
        )

    # --- the slow path --------------------------------------------------------------------------

    def _end_before_mark(self, now: int) -> bool:
        """A mark's end of the step before on the slow path (the step began there or its shapes
        changed; or no marked step is open: the first mark, one after a `with` step). False: the
        mark is ignored (closed, or inside a `with agent.step()` block)."""
        if self.closed:
            return False
        if self.depth > 0:
            self._log.warning(
                "mark-in-step", "mfuscope: agent.mark_step() inside `with agent.step()`; ignored"
            )
            return False
        if self.depth == MARKED:
            self._end_marked(now)
        self.depth = MARKED  # the step the mark begins (steady, or `_begin_marked`)
        return True

    def _begin_marked(self, now: int, given: StepFlopsValue | None) -> None:
        """A mark's step begun on the slow path at `now` (the step before has ended)."""
        self.last_end_ns = now
        self.depth = 0
        self._begin_slow(given, start=now)
        if self.depth == 1:
            self.depth = MARKED
            self.marked_given = given

    def _end_marked(self, now: int, *, failed: bool = False) -> None:
        """End the open marked step at `now` (the slow path's end)."""
        given, self.marked_given = self.marked_given, None
        self.depth = 1
        self._end_slow(now, failed=failed, given=given)

    def _begin_slow(self, given: StepFlopsValue | None, start: int | None = None) -> None:
        """Begin a step on the slow path, at `start` (None: now); a marked step still open ends
        there first."""
        if self.closed:
            return
        if self.depth == MARKED:
            start = perf_counter_ns() if start is None else start
            self._end_marked(start)
        self.depth += 1
        if self.depth > 1:
            self._log.warning("nested-step", "mfuscope: agent.step() nested; inner one ignored")
            return
        n = self.begun
        step = self.first_step + n
        if self.thread_clock is not None and get_ident() != self.clock_thread:
            # Steps moved to another thread: the file names the thread that opened it.
            self._thread_clock_failed(RuntimeError("steps moved to another thread"))
        self.starts[n & _MASK] = perf_counter_ns() if start is None else start
        self.forwards_matched = RECORDING  # this step ends on the slow path too
        flops, windows = self._flops, self._windows
        assert flops is not None and windows is not None
        if self.timer is not None:
            device_start(self, n)
        elif self.read_thread_clock is not None:
            try:
                self.thread_starts[n & _MASK] = self.read_thread_clock()
            except OSError as exc:
                self._thread_clock_failed(exc)
        try:
            # Never count FLOPs inside a profiled window: the counter would distort the trace
            # (a count due at an agreed window's first step waits, the window does not).
            flops.begin_step(
                allow_count=given is None and not (windows.recording or windows.opens_at(step))
            )
        except Exception as exc:
            flops.abort()
            self.internal_error("flop-count", exc)
        try:
            windows.begin_step(step, allowed=not flops.counting)
        except Exception as exc:
            self.internal_error("window", exc)
        if windows.recording:
            self.window_steps.append(step)  # its report waits for the window's analysis
        self.begun = n + 1  # published after the step's window membership

    def _end_slow(self, now: int, *, failed: bool, given: StepFlopsValue | None) -> None:
        if self.closed or self.depth <= 0:
            return
        self.depth -= 1
        if self.depth > 0:
            return
        step = self.first_step + self.begun - 1
        flops, windows = self._flops, self._windows
        assert flops is not None and windows is not None
        try:
            windows.end_step(step)
        except Exception as exc:
            self.internal_error("window", exc)
        if self.timer is not None:
            device_end(self)
        value: StepFlopsValue | None = None
        try:
            value = flops.end_step(failed=failed, given=given)
        except Exception as exc:
            flops.abort()
            self.internal_error("flop-count", exc)
        self.flops_log.append((step, value, flops.steady_value))
        try:
            while (result := windows.poll()) is not None:
                self.window_results.append((step, result))
        except Exception as exc:
            self.internal_error("window", exc)
        self.forwards_matched = OUTSIDE
        self.last_end_ns = now
        self._plan(step)

    def _plan(self, step: int) -> None:
        """After `step`: the first step that must take the slow path again."""
        assert self._flops is not None and self._windows is not None
        following = step + 1
        attention = self._windows.next_attention_step()
        if self._flops.counting or (attention is not None and attention <= following):
            due = following
        else:
            due = _NEVER if attention is None else attention
        self.slow_from = due - self.first_step

    def end_marked(self, *, failed: bool = False) -> None:
        """End the open marked step now, if there is one (at close, or where something that is
        no step begins: a phase between steps). `failed`: the training loop raised in it (a
        FLOP count it ran is not kept). Never raises."""
        if self.depth == MARKED and not self.closed:
            try:
                self._end_marked(perf_counter_ns(), failed=failed)
            except Exception as exc:
                self.internal_error("end-marked", exc)

    def close(self, *, failed: bool = False) -> None:
        """No step is recorded from here on. A marked step still open ends here (`end_marked`);
        a `with agent.step()` step still open is not ended (the report thread ends it at close,
        its FLOPs unknown)."""
        self.end_marked(failed=failed)
        self.closed = True
        self.slow_from = -1

    def internal_error(self, where: str, exc: BaseException) -> None:
        """Count and log (at most once per interval) an agent bug; training continues."""
        self._health.add_internal_error()
        self._log.warning(
            f"internal-{where}", "mfuscope: agent error in %s (training continues): %r", where, exc
        )


class GivenStep:
    """The context manager of `agent.step(flops=...)`: a step given its own FLOPs (slow path)."""

    __slots__ = ("_given", "_recorder")

    def __init__(self, recorder: StepRecorder, given: StepFlopsValue) -> None:
        self._recorder = recorder
        self._given = given

    def __enter__(self) -> GivenStep:
        self._recorder._begin_slow(self._given)
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self._recorder._end_slow(perf_counter_ns(), failed=exc_type is not None, given=self._given)
