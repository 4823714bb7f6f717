"""The training thread's side of the agent: the context manager `agent.step()` returns.

What the hot path may do
------------------------
On a *steady* step (the common case: no profiled window starts, records or awaits its analysis
on it, no window decision is due, no FLOP count starts, and the step's forward shapes match the
steady ones), `StepRecorder.__enter__` and `__exit__` together may only:

- read `time.perf_counter_ns()` twice (the step's start and its end);
- store the start in a preallocated ring slot (`starts[n % CAPACITY]`), the end and the count of
  steps begun (`begun`, which publishes the slot) in this object's slots;
- reset and compare a few ints of this object: the nesting depth, the step from which the slow
  path is due (`slow_from`), the count of the step's forwards that matched the steady shapes
  (`forwards_matched`, kept by the model's forward pre-hook, `step_flops.FlopsTracker`);
- on a GPU, record a CUDA event at each boundary (`step_timer.DeviceEventStepTimer`: a pooled
  event and a deque append; never a synchronisation);
- on a CPU timeline (no device timer), also store the thread's schedstat line in a second ring
  slot (`thread_clock`: one `pread` of /proc, the one system call of the path: about 2 us in one
  process and 12 us after a gloo DDP step on this VM; its module says why per step), from which
  the periodic thread works out how long the step was blocked.

Nothing else: no lock, no allocation besides the clock's int and that line, no logging call, no
dictionary, no report, no call into the rest of the agent. The agent's periodic thread
(`_step_reports`) turns the ring into periods, FLOPs into reports, encodes and ships them, hands
the collective reader its step starts and the window coordinator its baseline of step periods.

The hot path is Python. After a DDP step the training thread's caches are cold and every
Python frame and attribute costs memory lines; in benchmarks/agent_overhead.py the in-agent
median is under twice the floor's (one timestamp appended to a list), figures in docs/agent.md
"Overhead". A C twin once took that to 1.3 times, about 3 us per step, which no training step
notices; one hot path that mypy checks and the tests run is worth more.

The slow path (`_begin_slow`, `_end_slow`) is taken by the steps that need more: the first one
(FLOPs counted), the steps that open or belong to a profiled window or wait for its analysis (the
profiler starts and stops on the steps that take the window), decision steps of the window
schedule, steps given their own FLOPs, nested or failing steps, and a step whose forward shapes
changed. All of them but the last are known before the step begins (`slow_from`, set by the
previous slow step); the forward hook sees the last during the step.

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
from typing import TYPE_CHECKING

from mfuscope.agent._health import HealthCounters, RateLimitedLog
from mfuscope.agent.step_flops import NO_STEADY, OUTSIDE, RECORDING, StepFlopsValue
from mfuscope.agent.step_timer import StepTimer
from mfuscope.agent.thread_clock import ThreadClock

if TYPE_CHECKING:
    from mfuscope.agent._window_coordinator import WindowCoordinator, WindowResult
    from mfuscope.agent.step_flops import FlopsTracker

__all__ = ["CAPACITY", "GivenStep", "StepRecorder"]

# Steps the ring holds (a power of two). The periodic thread reads it at least every 0.1 s, and
# sooner when steps come fast enough to fill a quarter of it in that time: it falls a whole ring
# behind only when steps come faster than it builds their reports (tens of microseconds each).
CAPACITY = 4096
_MASK = CAPACITY - 1
# `slow_from` when no slow step is planned.
_NEVER = 1 << 62

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
        "depth",
        "first_step",
        "flops_log",
        "forwards_matched",
        "last_end_ns",
        "phase_log",
        "read_thread_clock",
        "slow_from",
        "starts",
        "steady_forwards",
        "thread_clock",
        "thread_starts",
        "timer",
        "window_results",
        "window_steps",
    )
    begun: int  # steps begun; step `first_step + n` has ring slot `n % CAPACITY`
    depth: int  # nesting of `with agent.step()`: only the outermost one is a step
    first_step: int
    forwards_matched: int  # kept by the model's forward pre-hook (step_flops.ForwardCounts)
    last_end_ns: int  # perf_counter_ns at the latest step's end
    slow_from: int  # the first step (as a count of steps begun) that takes the slow path
    starts: list[int]  # perf_counter_ns at each step's start (the ring)
    steady_forwards: int
    timer: StepTimer | None  # device timer (GPU), None on CPU
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
        timer: StepTimer | None,
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
            self._device_mark(self.first_step + n, True)
        elif self.read_thread_clock is not None:
            try:  # free unless it raises (CPython 3.11+)
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
            self._device_mark(self.first_step + self.begun - 1, False)
        self.last_end_ns = now
        self.forwards_matched = OUTSIDE
        self.depth = 0

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

    def _device_mark(self, step: int, begin: bool) -> None:
        """Mark a step boundary on the device (GPU only: a CUDA event record)."""
        timer = self.timer
        assert timer is not None
        try:
            if begin:
                timer.begin(step)
            else:
                timer.end(step)
        except Exception as exc:
            self.internal_error("timer", exc)

    # --- the slow path --------------------------------------------------------------------------

    def _begin_slow(self, given: StepFlopsValue | None) -> None:
        if self.closed:
            return
        self.depth += 1
        if self.depth > 1:
            self._log.warning("nested-step", "mfuscope: agent.step() nested; inner one ignored")
            return
        n = self.begun
        step = self.first_step + n
        if self.thread_clock is not None and get_ident() != self.clock_thread:
            # Steps moved to another thread: the file names the thread that opened it.
            self._thread_clock_failed(RuntimeError("steps moved to another thread"))
        self.starts[n & _MASK] = perf_counter_ns()
        self.forwards_matched = RECORDING  # this step ends on the slow path too
        flops, windows = self._flops, self._windows
        assert flops is not None and windows is not None
        if self.timer is not None:
            self._device_mark(step, True)
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
        if self.closed or self.depth == 0:
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
            self._device_mark(step, False)
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

    def close(self) -> None:
        """No step is recorded from here on (a step still open is not ended)."""
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
