"""A step recorder and its report thread's drain, without the rest of the agent (unit tests).

`reporter_for(clock)` gives a `StepRecorder` (FLOPs given, no windows) and a `StepReporter` over
it whose assembler only collects the `TimedStep`s it is handed (and their FLOPs), so tests can
check the ring, the periods and the drain without a transport. The reporter's thread is not
started: tests call `drain()` themselves.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from mfuscope.agent import _runtime, _step_recorder
from mfuscope.agent._health import HealthCounters, RateLimitedLog
from mfuscope.agent._step_recorder import PyStepRecorder, StepRecorder
from mfuscope.agent._step_reports import StepReporter
from mfuscope.agent.step_flops import FlopsTracker, StepFlopsValue
from mfuscope.agent.step_timer import TimedStep

__all__ = [
    "RECORDER_CORES",
    "CollectingAssembler",
    "FakeClock",
    "FakeWindows",
    "recorder_class",
    "reporter_for",
    "use_recorder_clock",
    "use_recorder_core",
]

# The step recorder's hot path: in C (agent/_step_core.c, where it is built) and in Python.
RECORDER_CORES = ("c", "python")
_recorder_class: type[StepRecorder] = StepRecorder


def recorder_class() -> type[StepRecorder]:
    """The recorder class `use_recorder_core` chose (the agent's default otherwise)."""
    return _recorder_class


def use_recorder_core(monkeypatch: pytest.MonkeyPatch, core: str) -> None:
    """Make the agent (and `reporter_for`) build recorders with the `core` hot path."""
    if core == "c":
        if _step_recorder._C_CORE is None:
            pytest.skip("the C step core is not built here (test_c_core_is_built says why)")
        chosen: type[StepRecorder] = StepRecorder
    else:
        chosen = PyStepRecorder
    monkeypatch.setattr(_runtime, "StepRecorder", chosen)
    monkeypatch.setitem(globals(), "_recorder_class", chosen)


@contextlib.contextmanager
def use_recorder_clock(monkeypatch: pytest.MonkeyPatch, clock: Callable[[], int]) -> Iterator[None]:
    """Inside it, both hot paths (and the slow path) read `clock` as their perf_counter_ns."""
    monkeypatch.setattr(_step_recorder, "perf_counter_ns", clock)
    core = _step_recorder.C_CORE_MODULE
    if core is None:
        yield
        return
    core.set_clock(clock)
    try:
        yield
    finally:
        core.set_clock(None)


class FakeClock:
    """perf_counter_ns as the recorder and the reporter see it: `now_ns`, moved by the test."""

    def __init__(self, start_ns: int = 1_000_000_000) -> None:
        self.now_ns = start_ns

    def __call__(self) -> int:
        return self.now_ns

    def advance(self, seconds: float) -> None:
        self.now_ns += round(seconds * 1e9)


class FakeWindows:
    """The window coordinator as the recorder and the reporter see it, with nothing ever due."""

    recording = False

    def __init__(self) -> None:
        self.walls: list[tuple[int, float]] = []

    def opens_at(self, step: int) -> bool:
        return False

    def begin_step(self, step: int, *, allowed: bool) -> None:
        return None

    def end_step(self, step: int) -> None:
        return None

    def poll(self) -> None:
        return None

    def next_attention_step(self) -> int | None:
        return None

    def observe_wall(self, step: int, wall_s: float) -> None:
        self.walls.append((step, wall_s))

    @staticmethod
    def flops_and_windows(recorder: StepRecorder | None = None) -> tuple[FlopsTracker, Any]:
        flops = FlopsTracker(
            given=(1e9, 0.0), new_session=None, log=RateLimitedLog(60.0), match=recorder
        )
        return flops, FakeWindows()


class CollectingAssembler:
    """Collects what the reporter hands a `ReportAssembler`; builds no report."""

    def __init__(self) -> None:
        self.timed: list[TimedStep] = []
        self.flops: dict[int, StepFlopsValue] = {}

    def flops_counted(self, step: int, flops: StepFlopsValue) -> None:
        self.flops[step] = flops

    def resolved(self, step: int) -> bool:
        return False

    def step_finished(self, timed: TimedStep, *, hold: bool) -> list[Any]:
        self.timed.append(timed)
        return []

    def window_finished(self, result: Any) -> list[Any]:
        return []


def reporter_for(
    clock: Callable[[], int],
    *,
    wall_offset_ns: int = 0,
    health: HealthCounters | None = None,
    collectives: Any = None,
) -> tuple[StepRecorder, StepReporter, list[TimedStep]]:
    """A bound recorder (first step 0), its reporter, and the list of `TimedStep`s it hands on.
    `clock`: perf_counter_ns as the recorder sees it; the wall clock is `clock` + offset.
    `collectives`: anything with `step_began(step, start_unix_ns)`."""
    health = health or HealthCounters()
    log = RateLimitedLog(60.0)
    recorder = _recorder_class(first_step=0, timer=None, health=health, log=log)
    flops, windows = FakeWindows.flops_and_windows(recorder)
    recorder.bind(flops, windows)
    assembler = CollectingAssembler()
    reporter = StepReporter(
        recorder,
        assembler=assembler,
        windows=windows,
        ship=lambda reports: None,
        health=health,
        log=log,
        collectives=collectives,
        clock_ns=clock,
        wall_clock_ns=lambda: clock() + wall_offset_ns,
    )
    return recorder, reporter, assembler.timed
