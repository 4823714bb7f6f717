"""`agent.phase(name)`: named time outside the steps (docs/definitions.md#job-time-ledger).

``with agent.phase("checkpoint_save"): save(...)`` between two steps takes the save out of the
step before it and books it as ``checkpoint_save``. A phase costs a clock read at each end and, at
its end, one append to the step recorder's `phase_log` deque (atomic under the GIL, read by the
periodic thread like the slow steps' records): nothing on any step, nothing that can raise into
the training loop. The periodic thread (`_job_time`) splits each step's period around the phases
in it.

A phase inside a step (``with agent.step(): with agent.phase(...)``) is part of that step, and a
phase that contains steps is not a phase: both are left out, said once in the log.
"""

from __future__ import annotations

from time import perf_counter_ns
from types import TracebackType

from mfuscope.agent._health import RateLimitedLog
from mfuscope.agent._step_recorder import StepRecorder
from mfuscope.core.ledger import phase_category

__all__ = ["Phase"]


class Phase:
    """The context manager `agent.phase(name)` returns, booked under `name`'s ledger category
    (`core.ledger.phase_category`). Without a recorder (a disabled agent) it does nothing."""

    __slots__ = ("_begun", "_category", "_log", "_recorder", "_start_ns")

    def __init__(self, recorder: StepRecorder | None, name: str, log: RateLimitedLog) -> None:
        self._recorder = recorder
        self._category = phase_category(name)
        self._log = log
        self._start_ns = 0
        self._begun = 0

    def __enter__(self) -> Phase:
        recorder = self._recorder
        if recorder is not None:
            self._begun = recorder.begun
            self._start_ns = perf_counter_ns()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        recorder = self._recorder
        if recorder is None:
            return
        if recorder.begun != self._begun:
            self._log.warning(
                "phase-steps", "mfuscope: steps ran inside agent.phase(): the phase is left out"
            )
            return
        self.record(self._start_ns, perf_counter_ns())

    def record(self, start_ns: int, end_ns: int) -> None:
        """Book a phase timed elsewhere, from `time.perf_counter_ns()` readings at its start and
        end: for an integration that hears of a phase only once it is over. Record it before the
        next step begins."""
        recorder = self._recorder
        if recorder is None or recorder.closed or end_ns <= start_ns:
            return
        if recorder.depth > 0:  # inside `with agent.step()`; a marked step (< 0) is between
            self._log.warning(
                "phase-in-step", "mfuscope: agent.phase() inside agent.step() is part of the step"
            )
            return
        recorder.phase_log.append((start_ns, end_ns, self._category))
