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
from mfuscope.agent import _step_recorder
from mfuscope.agent._health import HealthCounters, RateLimitedLog
from mfuscope.agent._step_flops import FlopsTracker, StepFlopsValue
from mfuscope.agent._step_recorder import StepRecorder
from mfuscope.agent._step_reports import StepReporter
from mfuscope.agent._thread_clock import ThreadClock
from mfuscope.agent.step_timer import DeviceEventStepTimer, TimedStep

__all__ = [
    "CollectingAssembler",
    "FakeClock",
    "FakeWindows",
    "reporter_for",
    "use_recorder_clock",
]


@contextlib.contextmanager
def use_recorder_clock(monkeypatch: pytest.MonkeyPatch, clock: Callable[[], int]) -> Iterator[None]:
    """Inside it, the step recorder reads `clock` as its perf_counter_ns."""
    with monkeypatch.context() as patch:
        patch.setattr(_step_recorder, "perf_counter_ns", clock)
        yield


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
    thread_clock: ThreadClock | None = None,
    timer: DeviceEventStepTimer | None = None,
) -> tuple[StepRecorder, StepReporter, list[TimedStep]]:
    """A bound recorder (first step 0), its reporter, and the list of `TimedStep`s it hands on.
    `clock`: perf_counter_ns as the recorder sees it; the wall clock is `clock` + offset.
    `collectives`: anything with `step_began(step, start_unix_ns)`. `thread_clock`: the
    training thread's schedstat reader (None: not read). `timer`: a device timer (GPU path)."""
    health = health or HealthCounters()
    log = RateLimitedLog(60.0)
    recorder = StepRecorder(
        first_step=0, timer=timer, health=health, log=log, thread_clock=thread_clock
    )
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
        timer=timer,
        clock_ns=clock,
        wall_clock_ns=lambda: clock() + wall_offset_ns,
    )
    return recorder, reporter, assembler.timed
