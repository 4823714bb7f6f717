"""The profiled-window life cycle inside the agent: open, record, hand off, pick up the result.

The coordinator says which steps belong to a window whose analysis is still out (`holds`) and
hands back a `WindowResult` when it is in; turning that result into step reports is the job of
`_report_assembly`. A failed window (profiler or analysis error, or analysis slower than
`analysis_timeout_s`) is counted, logged once per interval, and comes back with no
decompositions, so its steps keep the previous breakdown.

Windows open on the steps the `AlignedSchedule` agreed with every rank; this rank follows that
chain whether it records the window or not (a failed, skipped or busy window on one rank moves
no other rank's windows).

Threads: the window life cycle (`begin_step`, `end_step`, `poll`) runs on the training thread,
and only on the steps `next_attention_step` names (the agent's step recorder skips the others).
`observe_wall` runs on the agent's periodic thread, which learns each step's period; the window
cost bookkeeping the two threads share (recent periods, the window steps' periods, the pending
cost) is guarded by a lock that the training thread takes only on window steps and decision
steps. What starting and stopping the profiler cost the training thread is kept per window
(`switch_costs_s`), on the steps that take the window.
"""

from __future__ import annotations

import math
import statistics
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from mfuscope.agent._health import HealthCounters, RateLimitedLog
from mfuscope.agent._known_waits import KnownWaits
from mfuscope.agent._profiler_windows import (
    ProfilerBusy,
    ProfilerLike,
    WindowAnalyser,
    WindowOutcome,
    WindowRecorder,
)
from mfuscope.agent._window_schedule import AgreementError, AlignedSchedule, RankView
from mfuscope.core.step_report import (
    DecompositionLike,
)

__all__ = ["WindowCoordinator", "WindowResult"]

# Recent non-window step periods kept for the baseline the window cost is measured against.
_BASELINE_STEPS = 32
# Windows whose profiler start + stop time is kept (`switch_costs_s`).
_SWITCH_COSTS_KEPT = 16
# `next_attention_step` while the coordinator must see every step.
EVERY_STEP = -1


@dataclass(frozen=True)
class WindowResult:
    """A finished profiled window: its steps and the engine's decomposition of each of them the
    trace held (empty when the window failed)."""

    steps: tuple[int, ...]
    decompositions: tuple[DecompositionLike, ...]


class WindowCoordinator:
    """Owns the schedule, the recorder and the analyser (see the module docstring for which
    thread calls what)."""

    def __init__(
        self,
        *,
        schedule: AlignedSchedule,
        recorder: WindowRecorder,
        analyser: WindowAnalyser,
        analysis_timeout_s: float,
        health: HealthCounters,
        log: RateLimitedLog,
        clock: Callable[[], float],
        record: bool = True,
        known_waits: KnownWaits | None = None,
    ) -> None:
        """`known_waits` (CPU timelines): where the training thread's blocked time inside the
        profiler's start, step marks and stop is noted (it is the profiler's, never
        communication); with it, the window's last step also exports the trace here
        (`_end_and_export`)."""
        self._schedule = schedule
        self._known_waits = known_waits
        self._recorder = recorder
        self._analyser = analyser
        self._analysis_timeout_s = analysis_timeout_s
        self._health = health
        self._log = log
        self._clock = clock
        self._record = record  # False: follow the agreed schedule without profiling
        self._open: list[int] = []  # steps of the window being recorded
        self._awaiting: tuple[int, ...] | None = None  # steps handed to the analyser
        self._awaiting_since = 0.0
        # Windows that ended without an analysis (a profiler failure): their steps' reports need
        # not wait; handed out by `poll` as results without decompositions.
        self._released: list[WindowResult] = []
        # Cost bookkeeping, shared with the periodic thread (`observe_wall`): under `_costs`.
        self._costs = threading.Lock()
        self._baseline: deque[float] = deque(maxlen=_BASELINE_STEPS)
        self._window_walls: dict[int, float] = {}
        self._pending_cost: tuple[tuple[int, ...], float] | None = None  # steps, analysis cpu s
        self._members: set[int] = set()  # recorded window steps whose period is not in yet
        self._last_cost_s: float | None = None  # this rank's cost of its latest measured window
        self._schedule_failure_logged = False
        self._switch_s = 0.0  # the open window's profiler start time so far (s)
        # Training-thread time to start + stop the profiler, per recent window (s).
        self.switch_costs_s: deque[float] = deque(maxlen=_SWITCH_COSTS_KEPT)

    @property
    def last_cost_s(self) -> float | None:
        """This rank's measured cost (s) of its latest measured window: its steps' extra time
        over the baseline plus the analysis CPU time (None before the first)."""
        return self._last_cost_s

    def next_attention_step(self) -> int | None:
        """The next step (this rank's numbering) whose begin or end needs `begin_step` /
        `end_step` / `poll`: `EVERY_STEP` while a window records, an analysis is out, a window
        waits to be marked done or released, or a failure to be logged; else the schedule's next
        start or check; None when none is planned (profiling off, or the schedule stopped)."""
        schedule = self._schedule
        if (
            self._open
            or self._awaiting is not None
            or self._released
            or schedule.done_pending
            or (schedule.failure is not None and not self._schedule_failure_logged)
        ):
            return EVERY_STEP
        return schedule.next_action_step()

    # --- training thread, per step -----------------------------------------------------------

    def opens_at(self, step: int) -> bool:
        """Whether the agreed schedule opens a window at `step` (this rank's numbering)."""
        return self._schedule.opens_at(step)

    def begin_step(self, step: int, *, allowed: bool) -> None:
        """Open the window the schedule opens at `step` (when `allowed`), or continue the open
        one. A window this rank cannot take is skipped here alone; the schedule goes on."""
        if self._open:
            self._open.append(step)
            with self._costs:
                self._members.add(step)
            self._guarded(lambda: self._timed(self._recorder.begin_step, step, False), step)
            return
        if not self._record or not self._schedule.opens_at(step):
            return
        if not allowed or self._awaiting is not None or self._analyser.busy:
            self._log.info(
                "window-skipped",
                "mfuscope: profiled window at step %d skipped on this rank (%s)",
                step,
                "FLOPs being counted" if not allowed else "the previous analysis still runs",
            )
            return
        self._open = [step]
        with self._costs:
            self._members.add(step)
        started = time.perf_counter()
        self._guarded(
            lambda: self._timed(self._recorder.begin_step, step, True), step, starting=True
        )
        self._switch_s = time.perf_counter() - started

    def end_step(self, step: int) -> None:
        self._end_window_step(step)
        if not self._open and self._awaiting is None:
            try:  # the latest window is behind this rank (its cost, once its walls are in,
                # is usually published already: analysis outlasts a few steps)
                self._schedule.window_done()
            except AgreementError as exc:
                self._log.warning(
                    "window-done", "mfuscope: could not tell other ranks a window is done (%s)", exc
                )
        self._schedule.step_ended(step, self._view)
        if self._schedule.failure is not None and not self._schedule_failure_logged:
            self._schedule_failure_logged = True
            self._log.warning(
                "window-agreement",
                "mfuscope: ranks could not agree on profiled windows (%s); no more windows on "
                "this rank",
                self._schedule.failure,
            )

    def _end_window_step(self, step: int) -> None:
        if not self._open or self._open[-1] != step:
            return
        last = len(self._open) >= self._schedule.params.window_steps
        steps = tuple(self._open)
        profiler: ProfilerLike | str | None = None

        def end() -> None:
            nonlocal profiler
            waits = self._known_waits
            if waits is None:
                profiler = self._recorder.end_step(last=last)
            else:
                profiler = waits.around(lambda: self._end_and_export(last), step)

        started = time.perf_counter()
        self._guarded(end, step)
        if last and self._open:
            self.switch_costs_s.append(self._switch_s + time.perf_counter() - started)
            self._open = []
            self._hand_off(steps, profiler)

    @property
    def recording(self) -> bool:
        """Whether a window is being recorded (a profiler is running)."""
        return bool(self._open)

    def holds(self, step: int) -> bool:
        """Whether `step`'s report must wait for its window's analysis."""
        return step in self._open or (self._awaiting is not None and step in self._awaiting)

    def observe_wall(self, step: int, wall_s: float) -> None:
        """Feed every finished step's period (s): the baseline and the window's own steps (the
        periodic thread)."""
        with self._costs:
            if step in self._members:
                self._members.discard(step)
                self._window_walls[step] = wall_s
                self._maybe_record_cost()
            else:
                self._baseline.append(wall_s)

    def poll(self) -> WindowResult | None:
        """Pick up a finished analysis or a released window (non-blocking); None while there is
        nothing to pick up."""
        if self._released:
            return self._released.pop(0)
        if self._awaiting is None:
            return None  # the common case: nothing to pick up
        outcome = self._analyser.poll()
        if outcome is None:
            if self._awaiting is not None and (
                self._clock() - self._awaiting_since > self._analysis_timeout_s
            ):
                return self._fail(self._awaiting, "analysis timed out")
            return None
        return self._resolve(outcome)

    def wait(self, timeout_s: float) -> WindowResult | None:
        """At close: wait up to `timeout_s` for the awaited analysis."""
        if self._awaiting is None:
            return None
        outcome = self._analyser.wait(timeout_s)
        if outcome is None:
            return self._fail(self._awaiting, "analysis not finished at close")
        return self._resolve(outcome)

    def close(self) -> None:
        """At close, after the last window: stop following the schedule (rank 0 tells the other
        ranks no decision will come). Never raises."""
        self._schedule.close()

    def close_window(self) -> None:
        """At close: end a window left open by an interrupted loop and hand it to the analyser."""
        if self._open:
            steps = tuple(self._open)
            self._open = []
            try:
                profiler = self._recorder.end_step(last=True)
            except Exception as exc:
                self._recorder.abort()
                self._release(steps)
                self._profiler_failure(f"{type(exc).__name__}: {exc}")
                return
            self._hand_off(steps, profiler)

    # --- internals -----------------------------------------------------------------------------

    def _view(self) -> RankView:
        """This rank's inputs to a window-start offer (see `AlignedSchedule`)."""
        with self._costs:
            return RankView(
                step_s=statistics.median(self._baseline) if self._baseline else None,
                cost_s=self._last_cost_s,
            )

    def _hand_off(self, steps: tuple[int, ...], profiler: ProfilerLike | str | None) -> None:
        """Give a recorded window to the analyser: its stopped profiler, or its exported trace
        (None: the recorder had nothing to give)."""
        if profiler is not None:
            self._awaiting = steps
            self._awaiting_since = self._clock()
            self._analyser.submit(profiler, steps)
        else:
            self._release(steps)

    def _end_and_export(self, last: bool) -> ProfilerLike | str | None:
        """End the window step; on its last, stop the profiler and (CPU timelines, where
        `known_waits` is set) export its trace here rather than on the analyser thread
        (`WindowAnalyser`: the export holds the GIL, and the steps after the window would carry
        the stall as their own blocked time)."""
        profiler = self._recorder.end_step(last=last)
        if profiler is None:
            return None
        return self._analyser.export(profiler)

    def _timed(self, begin: Callable[..., None], step: int, first: bool) -> None:
        """`begin(step, first=first)`, its blocked time noted for `step` (`known_waits`)."""
        waits = self._known_waits
        if waits is None:
            begin(step, first=first)
        else:
            waits.around(lambda: begin(step, first=first), step)

    def _release(self, steps: tuple[int, ...]) -> None:
        """A window that ended without an analysis: its steps' reports need not wait."""
        if steps:
            self._released.append(WindowResult(steps, ()))

    def _guarded(self, action: Callable[[], None], step: int, *, starting: bool = False) -> None:
        """Run a profiler action; a failure ends the open window. `starting`: the action starts
        the window, whose failure leaves nothing profiled and so no cost to measure (the step's
        wall would only add scheduling noise to the budget every rank follows)."""
        try:
            action()
        except ProfilerBusy:
            self._recorder.abort()
            self._release(tuple(self._open))
            self._open = []
            with self._costs:
                self._members.discard(step)
            self._log.info(
                "profiler-busy",
                "mfuscope: another torch.profiler is recording; profiled window skipped",
            )
        except Exception as exc:
            self._recorder.abort()
            self._release(tuple(self._open))
            with self._costs:
                if starting:
                    self._members.discard(step)
                elif self._open:
                    self._pending_cost = (tuple(self._open), 0.0)
            self._open = []
            self._profiler_failure(f"step {step}: {type(exc).__name__}: {exc}")

    def _profiler_failure(self, reason: str) -> None:
        self._health.add_profiler_failure()
        self._log.warning(
            "profiler-failed",
            "mfuscope: profiled window failed (%s); training continues without a fresh breakdown",
            reason,
        )

    def _fail(self, steps: tuple[int, ...], reason: str) -> WindowResult:
        if self._awaiting == steps:
            self._awaiting = None
        self._profiler_failure(reason)
        with self._costs:
            self._pending_cost = (steps, 0.0)
            self._maybe_record_cost()
        return WindowResult(steps, ())

    def _resolve(self, outcome: WindowOutcome) -> WindowResult | None:
        if self._awaiting != outcome.steps:
            return None  # a late answer for a window already given up on
        self._awaiting = None
        if outcome.keep_error is not None:
            self._log.warning(
                "keep-trace-failed",
                "mfuscope: could not keep the window's trace (%s); analysis goes on",
                outcome.keep_error,
            )
        if outcome.error is not None:
            return self._fail(outcome.steps, outcome.error)
        wanted = set(outcome.steps)
        found = tuple(d for d in outcome.decompositions if d.step in wanted)
        if not any(math.isfinite(d.wall_s) and d.wall_s > 0 for d in found):
            return self._fail(outcome.steps, "the trace held none of the window's steps")
        self._health.add_window_analysed()
        with self._costs:
            self._pending_cost = (outcome.steps, outcome.cpu_s)
            self._maybe_record_cost()
        return WindowResult(outcome.steps, found)

    def _maybe_record_cost(self) -> None:
        """Window cost = its steps' extra time over the baseline + the analysis CPU time.
        Caller holds `_costs`."""
        if self._pending_cost is None:
            return
        steps, cpu_s = self._pending_cost
        if not all(s in self._window_walls for s in steps):
            return
        walls = [self._window_walls.pop(s) for s in steps]
        baseline = statistics.median(self._baseline) if self._baseline else 0.0
        extra = sum(max(w - baseline, 0.0) for w in walls)
        self._pending_cost = None
        self._last_cost_s = extra + cpu_s
        try:
            self._schedule.record_cost(steps[0], self._last_cost_s)
        except AgreementError as exc:
            self._log.warning(
                "window-cost", "mfuscope: window cost not shared with other ranks (%s)", exc
            )
