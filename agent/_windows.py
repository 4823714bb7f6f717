"""The profiled-window life cycle inside the agent: open, record, hand off, resolve.

Steps of a window wait (their reports are held) until the window's analysis is in: then each
carries its *own* decomposition and collectives, and the window's average breakdown becomes the
one every later step carries. A failed window (profiler or analysis error, or analysis slower
than `analysis_timeout_s`) is counted, logged once per interval, and its steps are released
with the previous breakdown.
"""

from __future__ import annotations

import statistics
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from mfuscope.agent._health import HealthCounters, RateLimitedLog
from mfuscope.agent.reports import Breakdown, breakdown_from_steps, collective_samples
from mfuscope.agent.sampler import (
    ProfilerBusy,
    ProfilerLike,
    WindowAnalyser,
    WindowOutcome,
    WindowRecorder,
    WindowSchedule,
)
from mfuscope.core.schema import CollectiveSample

__all__ = ["StepWindowData", "WindowCoordinator"]

# Recent non-window step periods kept for the baseline the window cost is measured against.
_BASELINE_STEPS = 32


@dataclass(frozen=True)
class StepWindowData:
    """What a profiled step's report carries from its window."""

    breakdown: Breakdown | None
    collectives: tuple[CollectiveSample, ...]


class WindowCoordinator:
    """Owns the schedule, the recorder and the analyser; all methods run on the training thread."""

    def __init__(
        self,
        *,
        schedule: WindowSchedule,
        recorder: WindowRecorder,
        analyser: WindowAnalyser,
        window_steps: int,
        analysis_timeout_s: float,
        health: HealthCounters,
        log: RateLimitedLog,
        clock: Callable[[], float],
    ) -> None:
        self._schedule = schedule
        self._recorder = recorder
        self._analyser = analyser
        self._window_steps = window_steps
        self._analysis_timeout_s = analysis_timeout_s
        self._health = health
        self._log = log
        self._clock = clock
        self._open: list[int] = []  # steps of the window being recorded
        self._awaiting: tuple[int, ...] | None = None  # steps handed to the analyser
        self._awaiting_since = 0.0
        self._resolved: dict[int, StepWindowData] = {}
        self.breakdown: Breakdown | None = None
        self._baseline: deque[float] = deque(maxlen=_BASELINE_STEPS)
        self._window_walls: dict[int, float] = {}
        self._pending_cost: tuple[tuple[int, ...], float] | None = None  # steps, analysis cpu s
        self.last_cost_s: float | None = None
        self._members: set[int] = set()  # recorded window steps whose period is not in yet

    # --- training thread, per step -----------------------------------------------------------

    def begin_step(self, step: int, *, allowed: bool) -> None:
        """Open a window if one is due (and `allowed`), or continue the open one."""
        if self._open:
            self._open.append(step)
            self._members.add(step)
            self._guarded(lambda: self._recorder.begin_step(step, first=False), step)
            return
        if not allowed or self._awaiting is not None or self._analyser.busy:
            return
        now = self._clock()
        if not self._schedule.due(step, now):
            return
        self._schedule.started(step, now)
        self._open = [step]
        self._members.add(step)
        self._guarded(lambda: self._recorder.begin_step(step, first=True), step)

    def end_step(self, step: int) -> None:
        if not self._open or self._open[-1] != step:
            return
        last = len(self._open) >= self._window_steps
        steps = tuple(self._open)
        profiler = None

        def end() -> None:
            nonlocal profiler
            profiler = self._recorder.end_step(last=last)

        self._guarded(end, step)
        if last and self._open:
            self._open = []
            self._hand_off(steps, profiler)

    @property
    def recording(self) -> bool:
        """Whether a window is being recorded (a profiler is running)."""
        return bool(self._open)

    def holds(self, step: int) -> bool:
        """Whether `step`'s report must wait for its window's analysis."""
        return step in self._open or (self._awaiting is not None and step in self._awaiting)

    def take_resolved(self, step: int) -> StepWindowData | None:
        return self._resolved.pop(step, None)

    def observe_wall(self, step: int, wall_s: float) -> None:
        """Feed every finished step's period (s): the baseline and the window's own steps."""
        if step in self._members:
            self._members.discard(step)
            self._window_walls[step] = wall_s
            self._maybe_record_cost()
        else:
            self._baseline.append(wall_s)

    def poll(self) -> tuple[int, ...]:
        """Pick up a finished analysis (non-blocking). Returns the steps it resolved."""
        if self._awaiting is None:
            return ()  # the common case, every step: nothing to pick up
        outcome = self._analyser.poll()
        if outcome is None:
            if self._awaiting is not None and (
                self._clock() - self._awaiting_since > self._analysis_timeout_s
            ):
                return self._fail(self._awaiting, "analysis timed out")
            return ()
        return self._resolve(outcome)

    def wait(self, timeout_s: float) -> tuple[int, ...]:
        """At close: wait up to `timeout_s` for the awaited analysis."""
        if self._awaiting is None:
            return ()
        outcome = self._analyser.wait(timeout_s)
        if outcome is None:
            return self._fail(self._awaiting, "analysis not finished at close")
        return self._resolve(outcome)

    def close_window(self) -> None:
        """At close: end a window left open by an interrupted loop and hand it to the analyser."""
        if self._open:
            steps = tuple(self._open)
            self._open = []
            try:
                profiler = self._recorder.end_step(last=True)
            except Exception as exc:
                self._recorder.abort()
                self._profiler_failure(f"{type(exc).__name__}: {exc}")
                return
            self._hand_off(steps, profiler)

    # --- internals -----------------------------------------------------------------------------

    def _hand_off(self, steps: tuple[int, ...], profiler: ProfilerLike | None) -> None:
        """Give a recorded window to the analyser (None: the recorder had nothing to give)."""
        if profiler is not None:
            self._awaiting = steps
            self._awaiting_since = self._clock()
            self._analyser.submit(profiler, steps)

    def _guarded(self, action: Callable[[], None], step: int) -> None:
        try:
            action()
        except ProfilerBusy:
            self._recorder.abort()
            self._open = []
            self._members.discard(step)
            self._log.info(
                "profiler-busy",
                "mfuscope: another torch.profiler is recording; profiled window skipped",
            )
        except Exception as exc:
            self._recorder.abort()
            if self._open:
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

    def _fail(self, steps: tuple[int, ...], reason: str) -> tuple[int, ...]:
        if self._awaiting == steps:
            self._awaiting = None
        self._profiler_failure(reason)
        for step in steps:
            self._resolved.setdefault(step, StepWindowData(self.breakdown, ()))
        self._pending_cost = (steps, 0.0)
        self._maybe_record_cost()
        return steps

    def _resolve(self, outcome: WindowOutcome) -> tuple[int, ...]:
        if self._awaiting != outcome.steps:
            return ()  # a late answer for a window already given up on
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
        found = [d for d in outcome.decompositions if d.step in wanted]
        window = breakdown_from_steps(found, max(outcome.steps))
        if window is None:
            return self._fail(outcome.steps, "the trace held none of the window's steps")
        self._health.add_window_analysed()
        self.breakdown = window
        by_step = {d.step: d for d in found}
        for step in outcome.steps:
            own = by_step.get(step)
            if own is None:
                self._resolved[step] = StepWindowData(window, ())
            else:
                self._resolved[step] = StepWindowData(
                    breakdown_from_steps([own], step) or window,
                    collective_samples(own.collectives),
                )
        self._pending_cost = (outcome.steps, outcome.cpu_s)
        self._maybe_record_cost()
        return outcome.steps

    def _maybe_record_cost(self) -> None:
        """Window cost = its steps' extra time over the baseline + the analysis CPU time."""
        if self._pending_cost is None:
            return
        steps, cpu_s = self._pending_cost
        if not all(s in self._window_walls for s in steps):
            return
        walls = [self._window_walls.pop(s) for s in steps]
        baseline = statistics.median(self._baseline) if self._baseline else 0.0
        extra = sum(max(w - baseline, 0.0) for w in walls)
        self._schedule.record_cost(extra + cpu_s)
        self._pending_cost = None
        self.last_cost_s = extra + cpu_s
