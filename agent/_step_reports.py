"""The agent's step reports: everything per step that need not run on the training thread.

It reads what the training thread's `StepRecorder` wrote (a ring of step start times, and the
records slow steps pass on; see `_step_recorder` for why no lock is needed) and, for each step:
works out its period (host clock; on GPU the `DeviceEventStepTimer` it polls), gives the
collective reader the step's start (wall clock), the window coordinator the period (its cost
baseline), takes the step's FLOPs (the steady ones unless the step logged its own), has the
`ReportAssembler` build the report (held while the step's window is analysed, or until the
collective reader has the step's collective durations) and ships it to every transport. It runs
on the agent's periodic thread (`_periodic`) every `interval_s`, sooner
when steps come fast enough to fill a quarter of the ring in that time; the collective reader
also asks it to catch up before each read, and the agent's `close()` drains it one last time on
the closing thread.
"""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING

from mfuscope.agent._health import HealthCounters, RateLimitedLog
from mfuscope.agent._periodic import Periodic, Task, adaptive_interval_s
from mfuscope.agent._report_assembly import ReportAssembler
from mfuscope.agent._step_flops import StepFlopsValue
from mfuscope.agent._step_recorder import CAPACITY, StepRecorder
from mfuscope.agent._thread_clock import ThreadTimes, thread_times
from mfuscope.agent.step_timer import StepTimer, TimedStep
from mfuscope.core.schema import MIN_STEP_SECONDS, StepReport

if TYPE_CHECKING:
    from mfuscope.agent._job_time import JobTime
    from mfuscope.agent._known_waits import KnownWaits
    from mfuscope.agent._window_coordinator import WindowCoordinator, WindowResult
    from mfuscope.agent.collective_reader import CollectiveReader

__all__ = ["StepReporter"]

# The longest pause between two reads of the ring (s), and the shortest.
INTERVAL_S = 0.1
MIN_INTERVAL_S = 0.005
# Read again before this share of the ring can have been written.
RING_SHARE = 0.25

_UNKNOWN = StepFlopsValue(0.0, 0.0, "unknown")
_NONE: tuple[None, None] = (None, None)  # a step whose thread clock was not read


class StepReporter:
    """Turns a `StepRecorder`'s records into shipped step reports, on the periodic thread."""

    def __init__(
        self,
        recorder: StepRecorder,
        *,
        assembler: ReportAssembler,
        windows: WindowCoordinator,
        ship: Callable[[Sequence[StepReport]], None],
        health: HealthCounters,
        log: RateLimitedLog,
        timer: StepTimer | None = None,
        collectives: CollectiveReader | None = None,
        job_time: JobTime | None = None,
        known_waits: KnownWaits | None = None,
        interval_s: float = INTERVAL_S,
        clock_ns: Callable[[], int] = time.perf_counter_ns,
        wall_clock_ns: Callable[[], int] = time.time_ns,
    ) -> None:
        """`clock_ns`: the recorder's clock (`time.perf_counter_ns`); `wall_clock_ns`: the wall
        clock the reports' start times are given in (ns since the epoch); `job_time`: the
        rank's part of the job-time ledger, whose phases come out of the steps' periods.
        `known_waits`: the blocked time the agent can name per step (a data loader's, its own
        profiler's), left out of each step's blocked time (`known_waits`)."""
        self._recorder = recorder
        self._assembler = assembler
        self._windows = windows
        self._ship = ship
        self._health = health
        self._log = log
        self._timer = timer
        self._collectives = collectives
        self._job_time = job_time
        self._known_waits = known_waits
        self._interval_s = interval_s
        self._clock_ns = clock_ns
        self._wall_clock_ns = wall_clock_ns
        self._lock = threading.Lock()  # one drain at a time (periodic or closing thread)
        self._periodic: Periodic | None = None
        self._task: Task | None = None
        self._last_read = (recorder.begun, time.monotonic())  # (steps begun, when)
        self._fed = 0  # steps whose start the collective reader has had (counts of steps begun)
        self._timed = 0  # steps whose period is taken from the ring (host clock)
        self._steady: StepFlopsValue | None = None  # the FLOPs of a step that logged none
        self._window_steps: set[int] = set()  # recorded in a window, report not built yet
        # Window results not applied yet: (the step from which they apply, the result).
        self._results: collections.deque[tuple[int, WindowResult]] = collections.deque()
        self.lost_steps = 0  # overwritten in the ring before they were read

    # --- the thread ----------------------------------------------------------------------------

    def start(self, periodic: Periodic) -> None:
        self._periodic = periodic
        self._task = periodic.add("reports", self.tick, delay_s=self._interval_s)

    def stop(self, timeout_s: float) -> None:
        """No more ticks (the caller drains what is left)."""
        if self._periodic is not None and self._task is not None:
            self._periodic.remove(self._task, timeout_s)

    def tick(self) -> float:
        """Drain; the pause before the next drain (s)."""
        self.drain()
        begun, now = self._recorder.begun, time.monotonic()
        last_begun, last_s = self._last_read
        self._last_read = (begun, now)
        return adaptive_interval_s(
            begun - last_begun,
            now - last_s,
            CAPACITY,
            max_s=self._interval_s,
            min_s=MIN_INTERVAL_S,
            share=RING_SHARE,
        )

    # --- draining ------------------------------------------------------------------------------

    def drain(self, *, final: bool = False, timeout_s: float = -1) -> None:
        """Report every step whose period is known (`final`: at close, after the last step,
        every step, the last one ending at its end). Never raises; waits at most `timeout_s`
        for another drain to finish (negative: as long as it takes)."""
        if not self._lock.acquire(timeout=timeout_s):
            return
        try:
            self._drain(final)
        except Exception as exc:  # the periodic thread never dies silently
            self._health.add_internal_error()
            self._log.warning("report-thread", "mfuscope: agent error reporting steps: %r", exc)
        finally:
            self._lock.release()

    def _drain(self, final: bool) -> None:
        recorder = self._recorder
        begun = recorder.begun  # read first: everything the steps before it did is visible
        # Where the last step ends at close: its own end, or now if it is still open.
        last_end = self._clock_ns() if final and recorder.depth else recorder.last_end_ns
        if self._job_time is not None:
            self._job_time.advance(begun, final, last_end, self._clock_ns)
        if self._timer is not None:
            timed = self._without_phases(self._timer.finish() if final else self._timer.poll())
        else:
            timed = self._host_periods(begun, final, last_end)
        while recorder.window_steps:  # after the periods: a step's membership comes before them
            self._window_steps.add(recorder.window_steps.popleft())
        self._feed_collectives(begun)
        reports: list[StepReport] = []
        assembler = self._assembler
        results = self._results
        while recorder.window_results:
            results.append(recorder.window_results.popleft())
        first = recorder.first_step
        last_open = first + begun - 1 if final and recorder.depth else None
        for step in timed:
            # A window result picked up at the end of step k: reports from step k on carry it.
            while results and results[0][0] <= step.step:
                reports.extend(assembler.window_finished(results.popleft()[1]))
            flops = _UNKNOWN if step.step == last_open else self._flops_of(step.step)
            self._windows.observe_wall(step.step, step.wall_s)
            assembler.flops_counted(step.step, flops)
            if self._known_waits is not None and step.blocked_s is not None:
                assembler.data_waited(step.step, self._known_waits.data_s(step.step - first))
            hold = step.step in self._window_steps and not assembler.resolved(step.step)
            self._window_steps.discard(step.step)
            reports.extend(assembler.step_finished(step, hold=hold))
        while final and results:  # at close: every result, after every step
            reports.extend(assembler.window_finished(results.popleft()[1]))
        if self._collectives is not None:  # the steps whose collective durations are all in
            reports.extend(assembler.durations_known(self._collectives.step_durations()))
        self._prune_flops_log(begun)
        if reports:
            self._ship(reports)

    def _phase_ns(self, step: int) -> int:
        return 0 if self._job_time is None else self._job_time.take_phase_ns(step)

    def _without_phases(self, timed: list[TimedStep]) -> list[TimedStep]:
        """Device periods less the phases between the steps (timed on the host)."""
        out = []
        for t in timed:
            phase_ns = self._phase_ns(t.step)
            out.append(
                replace(t, wall_s=max(t.wall_s - phase_ns / 1e9, MIN_STEP_SECONDS))
                if phase_ns
                else t
            )
        return out

    def _host_periods(self, begun: int, final: bool, last_end: int) -> list[TimedStep]:
        """Periods of the steps whose next step began (`final`: and of the last one, to
        `last_end`), from the ring's start times, less the phases between them (a step cut by
        a phase carries no thread times: its clock was read at neither end of the phase)."""
        recorder = self._recorder
        starts, first = recorder.starts, recorder.first_step
        offset_ns = self._wall_offset_ns()
        done: list[TimedStep] = []
        n = self._timed
        if begun - n > CAPACITY:  # a whole ring behind: those slots are rewritten already
            self._count_lost(begun - CAPACITY - n)
            n = begun - CAPACITY
        clocked = recorder.read_thread_clock is not None
        times = self._slot_times(n) if clocked else None  # each slot's line parsed once
        while n + 1 < begun:
            start = starts[n & (CAPACITY - 1)]
            following = starts[(n + 1) & (CAPACITY - 1)]
            phase_ns = self._phase_ns(first + n)
            period_s = _period_s(start, following - phase_ns)
            following_times = self._slot_times(n + 1) if clocked else None
            if phase_ns:  # a step with a phase: its thread's times span the phase too
                blocked, delay = _NONE
            else:
                blocked, delay = _blocked_and_delay(times, following_times, following - start)
                if blocked is not None and self._known_waits is not None:
                    blocked = max(blocked - self._known_waits.blocked_s(n), 0.0)
            done.append(TimedStep(first + n, start + offset_ns, period_s, blocked, delay))
            times = following_times
            n += 1
        if final and n < begun:
            start = starts[n & (CAPACITY - 1)]
            end = last_end - self._phase_ns(first + n)
            done.append(TimedStep(first + n, start + offset_ns, _period_s(start, end)))
            n += 1
        self._timed = n
        return self._still_in_ring(done)

    def _slot_times(self, n: int) -> ThreadTimes | None:
        """The thread clock's reading at the start of the step in slot n; None if not read."""
        raw = self._recorder.thread_starts[n & (CAPACITY - 1)]
        try:
            return thread_times(raw) if raw else None
        except ValueError:
            return None

    def _wall_offset_ns(self) -> int:
        """Wall clock minus the recorder's clock, now (ns): read at every drain, so a wall clock
        stepped or slewed meanwhile moves only the starts reported after it."""
        return self._wall_clock_ns() - self._clock_ns()

    def _still_in_ring(self, done: list[TimedStep]) -> list[TimedStep]:
        """Drop (and count) the steps the training thread may have overwritten while they were
        read: slot n is rewritten when step n + CAPACITY begins (its period also read slot
        n + 1, rewritten later)."""
        if not done:
            return done
        limit = self._recorder.first_step + self._recorder.begun - CAPACITY
        if done[0].step >= limit:
            return done
        kept = [t for t in done if t.step >= limit]
        self._count_lost(len(done) - len(kept))
        return kept

    def _count_lost(self, count: int) -> None:
        self.lost_steps += count
        self._health.add_dropped(count)
        self._log.warning(
            "steps-lost",
            "mfuscope: %d steps were not reported: the agent fell a whole ring (%d steps) "
            "behind (steps too short for the machine's load)",
            count,
            CAPACITY,
        )

    def _feed_collectives(self, begun: int) -> None:
        """The collective reader's step starts (wall clock), for every step begun."""
        reader = self._collectives
        recorder = self._recorder
        n = max(self._fed, begun - CAPACITY + 1)
        if reader is not None and n < begun:
            starts, first = recorder.starts, recorder.first_step
            offset_ns = self._wall_offset_ns()
            while n < begun:
                reader.step_began(first + n, starts[n & (CAPACITY - 1)] + offset_ns)
                n += 1
        self._fed = begun

    def _flops_of(self, step: int) -> StepFlopsValue:
        """The FLOPs of `step` (ended; steps are asked for in order): the ones a slow step
        logged, else the steady ones."""
        log = self._recorder.flops_log
        while log and log[0][0] < step:
            self._steady = log.popleft()[2]
        if log and log[0][0] == step:
            _, value, self._steady = log.popleft()
            return value or _UNKNOWN
        return self._steady or _UNKNOWN

    def _prune_flops_log(self, begun: int) -> None:
        """Entries of steps no period will come for any more (a device timer that dropped or
        failed them) leave the log."""
        log = self._recorder.flops_log
        oldest = self._recorder.first_step + begun - CAPACITY
        while log and log[0][0] < oldest:
            self._steady = log.popleft()[2]


def _period_s(start_ns: int, end_ns: int) -> float:
    """A period in seconds, at least the shortest step the wire schema takes (an empty
    `with agent.step(): pass` lasts less than a microsecond)."""
    return max((end_ns - start_ns) / 1e9, MIN_STEP_SECONDS)


def _blocked_and_delay(
    first: ThreadTimes | None, following: ThreadTimes | None, period_ns: int
) -> tuple[float | None, float | None]:
    """(blocked, run delay) of the training thread over a step of `period_ns` between two
    readings of its clock (s): the run delay is the time it waited for a CPU, the blocked time
    the period less that and its CPU time (`thread_clock`); None without both readings."""
    if first is None or following is None:
        return _NONE
    waited_ns = max(following.run_delay_ns - first.run_delay_ns, 0)
    cpu_ns = following.cpu_ns - first.cpu_ns
    return max(period_ns - cpu_ns - waited_ns, 0) / 1e9, waited_ns / 1e9
