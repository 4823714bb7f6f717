"""Profiled windows: the schedule, the recorder, the off-thread analyser and the coordinator."""

from __future__ import annotations

import contextlib
import functools
import os
import weakref
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from mfuscope.agent._health import HealthCounters, RateLimitedLog
from mfuscope.agent._profiler_windows import WindowAnalyser, WindowRecorder
from mfuscope.agent._window_coordinator import WindowCoordinator, WindowResult
from mfuscope.agent._window_schedule import AlignedSchedule, LocalAgreement, ScheduleParams

from tests.support.agent_fakes import EMPTY_TRACE, Decomposition, FakeProfiler
from tests.support.waiting import wait_until


def _annotate(log: list[str]) -> Any:
    @contextlib.contextmanager
    def annotate(name: str) -> Iterator[None]:
        log.append(f"enter {name}")
        yield
        log.append(f"exit {name}")

    return annotate


def test_recorder_brackets_steps_and_returns_the_stopped_profiler() -> None:
    log: list[str] = []
    recorder = WindowRecorder(lambda: FakeProfiler(log), annotate=_annotate(log))
    recorder.begin_step(7, first=True)
    assert recorder.end_step(last=False) is None
    recorder.begin_step(8, first=False)
    assert recorder.end_step(last=True) is not None
    assert log == [
        "start",
        "enter ProfilerStep#7",
        "exit ProfilerStep#7",
        "enter ProfilerStep#8",
        "exit ProfilerStep#8",
        "stop",
    ]
    assert not recorder.active


# A profiled step of 1 s: 50% compute, 10% recompute, 40% idle; 0.2 s of hidden communication.
_step = functools.partial(
    Decomposition,
    wall_s=1.0,
    compute_s=0.5,
    recompute_s=0.1,
    bubble_idle_s=0.4,
    overlapped_comm_s=0.2,
)


def test_analyser_exports_analyses_and_deletes_the_trace(tmp_path: Path) -> None:
    seen: list[str] = []

    def analyse(path: str) -> Sequence[Any]:
        seen.append(path)
        assert Path(path).read_text() == EMPTY_TRACE
        return [_step(3)]

    analyser = WindowAnalyser(analyse, temp_dir=str(tmp_path))
    analyser.submit(FakeProfiler([]), (3,))
    outcome = analyser.wait(10.0)
    assert outcome is not None and outcome.error is None
    assert [d.step for d in outcome.decompositions] == [3]
    assert outcome.cpu_s >= 0
    assert len(seen) == 1 and not os.path.exists(seen[0])
    assert list(tmp_path.iterdir()) == []
    analyser.close(1.0)


def test_analyser_reports_errors_and_still_deletes(tmp_path: Path) -> None:
    def analyse(path: str) -> Sequence[Any]:
        raise ValueError("not a trace")

    analyser = WindowAnalyser(analyse, temp_dir=str(tmp_path))
    analyser.submit(FakeProfiler([], fail="export"), (1,))
    analyser.submit(FakeProfiler([]), (2,))
    first, second = analyser.wait(10.0), analyser.wait(10.0)
    assert first is not None and "injected export failure" in (first.error or "")
    assert second is not None and "not a trace" in (second.error or "")
    assert list(tmp_path.iterdir()) == []
    analyser.close(1.0)


def test_analyser_frees_the_profilers_events_once_analysed(tmp_path: Path) -> None:
    # torch.profiler.profile is a reference cycle: its events (under `profiler`) must be let go
    # explicitly, or they live until a full garbage collection.
    class Events:
        pass

    events = Events()
    freed = weakref.ref(events)
    profiler = FakeProfiler([])
    profiler.profiler = events  # type: ignore[attr-defined]
    profiler.itself = profiler  # type: ignore[attr-defined]  # the cycle
    del events
    analyser = WindowAnalyser(lambda path: [_step(3)], temp_dir=str(tmp_path))
    analyser.submit(profiler, (3,))
    outcome = analyser.wait(10.0)
    analyser.close(1.0)
    assert outcome is not None and [d.step for d in outcome.decompositions] == [3]
    assert freed() is None


def _params(first: int, every_steps: int, window_steps: int) -> ScheduleParams:
    return ScheduleParams(
        first_window_step=first,
        every_steps=every_steps,
        every_s=1e9,
        window_steps=window_steps,
        max_overhead_ratio=1.0,
    )


class RecordingSchedule(AlignedSchedule):
    """A schedule that remembers every window cost it was given (window start, s)."""

    def __init__(self, params: ScheduleParams) -> None:
        super().__init__(params, LocalAgreement())
        self.costs: list[tuple[int, float]] = []

    def record_cost(self, window_start: int, cost_s: float) -> None:
        self.costs.append((window_start, cost_s))
        super().record_cost(window_start, cost_s)


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _coordinator(
    tmp_path: Path,
    analyse: Any,
    fail: str = "",
    clock: Clock | None = None,
    timeout_s: float = 60.0,
    analyser: WindowAnalyser | None = None,
    schedule: RecordingSchedule | None = None,
) -> tuple[WindowCoordinator, HealthCounters, list[str]]:
    log: list[str] = []
    health = HealthCounters()
    coordinator = WindowCoordinator(
        schedule=schedule or RecordingSchedule(_params(first=2, every_steps=4, window_steps=2)),
        recorder=WindowRecorder(lambda: FakeProfiler(log, fail), annotate=_annotate(log)),
        analyser=analyser or WindowAnalyser(analyse, temp_dir=str(tmp_path)),
        analysis_timeout_s=timeout_s,
        health=health,
        log=RateLimitedLog(60.0),
        clock=clock or Clock(),
    )
    return coordinator, health, log


def _run_steps(coordinator: WindowCoordinator, steps: range, clock: Clock | None = None) -> None:
    for step in steps:
        coordinator.begin_step(step, allowed=True)
        coordinator.end_step(step)
        coordinator.observe_wall(step, 1.0)
        if clock is not None:
            clock.now += 1.0


def _wait_resolved(coordinator: WindowCoordinator) -> WindowResult | None:
    resolved: list[WindowResult | None] = [None]

    def polled() -> bool:
        resolved[0] = coordinator.poll()
        return resolved[0] is not None

    wait_until(polled, "the window's analysis")
    return resolved[0]


def test_coordinator_holds_window_steps_until_their_analysis(tmp_path: Path) -> None:
    def analyse(path: str) -> Sequence[Any]:
        return [_step(2, compute_s=0.6, bubble_idle_s=0.3), _step(3)]

    clock = Clock()
    schedule = RecordingSchedule(_params(first=2, every_steps=4, window_steps=2))
    # the analysis thread's CPU clock, read before and after the analysis: 0.25 s of CPU
    cpu = iter([10.0, 10.25])
    analyser = WindowAnalyser(analyse, temp_dir=str(tmp_path), thread_time=lambda: next(cpu))
    coordinator, health, log = _coordinator(
        tmp_path, analyse, clock=clock, analyser=analyser, schedule=schedule
    )
    _run_steps(coordinator, range(0, 2), clock)
    assert log == [] and not coordinator.holds(1)
    _run_steps(coordinator, range(2, 4), clock)
    assert coordinator.holds(2) and coordinator.holds(3) and not coordinator.holds(4)
    result = _wait_resolved(coordinator)
    assert result is not None and result.steps == (2, 3)
    assert [d.step for d in result.decompositions] == [2, 3]
    assert not coordinator.holds(2)
    assert health.snapshot().windows_analysed_total == 1
    # steps of 1 s against a 1 s baseline: the cost is the analysis CPU time alone
    assert schedule.costs == [(2, pytest.approx(0.25))]
    # the next window opens 4 steps after the last one started
    _run_steps(coordinator, range(4, 6), clock)
    assert not coordinator.holds(5)
    _run_steps(coordinator, range(6, 7), clock)
    assert coordinator.holds(6)


def test_coordinator_counts_a_failing_profiler_and_moves_on(tmp_path: Path) -> None:
    coordinator, health, log = _coordinator(tmp_path, lambda path: [], fail="start")
    _run_steps(coordinator, range(0, 4))
    assert health.snapshot().profiler_failures_total == 1
    assert log.count("start") == 1
    assert not any(coordinator.holds(s) for s in range(4))


def test_coordinator_gives_up_on_a_slow_analysis(tmp_path: Path) -> None:
    clock = Clock()
    release = __import__("threading").Event()

    def analyse(path: str) -> Sequence[Any]:
        release.wait(10.0)
        return [_step(2), _step(3)]

    analyser = WindowAnalyser(analyse, temp_dir=str(tmp_path))
    coordinator, health, _ = _coordinator(
        tmp_path, analyse, clock=clock, timeout_s=5.0, analyser=analyser
    )
    _run_steps(coordinator, range(0, 4))
    assert coordinator.poll() is None
    clock.now += 6.0
    assert coordinator.poll() == WindowResult((2, 3), ())
    assert health.snapshot().profiler_failures_total == 1
    release.set()
    # the late answer comes in and is ignored
    wait_until(lambda: analyser.ready, "the late analysis")
    assert coordinator.poll() is None
    assert health.snapshot().windows_analysed_total == 0


def test_a_user_profiler_makes_the_window_skip_without_failure(tmp_path: Path) -> None:
    log: list[str] = []
    health = HealthCounters()
    coordinator = WindowCoordinator(
        schedule=AlignedSchedule(_params(first=0, every_steps=2, window_steps=2), LocalAgreement()),
        recorder=WindowRecorder(lambda: FakeProfiler(log), busy=lambda: True),
        analyser=WindowAnalyser(lambda path: [], temp_dir=str(tmp_path)),
        analysis_timeout_s=60.0,
        health=health,
        log=RateLimitedLog(60.0),
        clock=Clock(),
    )
    _run_steps(coordinator, range(0, 3))
    assert log == []
    assert health.snapshot().profiler_failures_total == 0
    assert not any(coordinator.holds(s) for s in range(3))


def test_torch_profiler_busy_sees_a_running_profiler() -> None:
    import torch
    from mfuscope.agent._profiler_windows import torch_profiler_busy

    assert not torch_profiler_busy()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]):
        assert torch_profiler_busy()
    assert not torch_profiler_busy()


def test_analyser_keeps_the_last_window_traces_rotated_and_capped(tmp_path: Path) -> None:
    import gzip

    from mfuscope.agent._kept_traces import TraceKeeper

    kept_dir = tmp_path / "kept"
    keeper = TraceKeeper(kept_dir, keep=2, max_bytes=1 << 20, rank=3)
    work = tmp_path / "work"
    work.mkdir()
    analyser = WindowAnalyser(lambda path: [_step(1)], temp_dir=str(work), keep=keeper.keep_trace)
    outcomes = []
    for first in (10, 20, 30):
        analyser.submit(FakeProfiler([]), (first, first + 1))
        outcomes.append(analyser.wait(10.0))
    analyser.close(1.0)
    assert all(o is not None and o.error is None and o.keep_error is None for o in outcomes)
    names = sorted(p.name for p in kept_dir.iterdir())
    assert len(names) == 2 and all(n.startswith("mfuscope-rank3-step") for n in names)
    assert {n.split("-")[2] for n in names} == {"step20", "step30"}  # the oldest went
    last = outcomes[-1]
    assert last is not None and last.kept_trace is not None
    with gzip.open(last.kept_trace, "rt") as handle:
        assert handle.read() == EMPTY_TRACE  # the very trace that was analysed
    assert list(work.iterdir()) == []  # the temporary export is still deleted


def test_kept_traces_respect_the_size_cap_but_keep_the_newest(tmp_path: Path) -> None:
    from mfuscope.agent._kept_traces import TraceKeeper

    source = tmp_path / "t.json"
    source.write_bytes(os.urandom(4096))  # incompressible: ~4 kB gzipped
    keeper = TraceKeeper(tmp_path / "kept", keep=10, max_bytes=6000, rank=0)
    for step in range(3):
        keeper.keep_trace(str(source), (step,))
    kept = sorted((tmp_path / "kept").iterdir())
    assert len(kept) == 1 and "step2-2" in kept[0].name  # one 4 kB file fits under 6000 bytes
    tiny = TraceKeeper(tmp_path / "tiny", keep=3, max_bytes=1, rank=0)
    tiny.keep_trace(str(source), (5,))
    assert len(list((tmp_path / "tiny").iterdir())) == 1  # bigger than the cap, still kept


def test_a_trace_that_cannot_be_kept_is_still_analysed(tmp_path: Path) -> None:
    def keep(path: str, steps: tuple[int, ...]) -> str:
        raise PermissionError("read-only")

    analyser = WindowAnalyser(lambda path: [_step(4)], temp_dir=str(tmp_path), keep=keep)
    analyser.submit(FakeProfiler([]), (4,))
    outcome = analyser.wait(10.0)
    analyser.close(1.0)
    assert (
        outcome is not None
        and outcome.error is None
        and [d.step for d in outcome.decompositions] == [4]
    )
    assert outcome.kept_trace is None and "read-only" in (outcome.keep_error or "")


class AttemptLog(WindowRecorder):
    """A recorder that notes each step at which a window was attempted."""

    def __init__(self, fail: str) -> None:
        super().__init__(lambda: FakeProfiler([], fail), annotate=_annotate([]))
        self.attempts: list[int] = []

    def begin_step(self, step: int, *, first: bool) -> None:
        if first:
            self.attempts.append(step)
        super().begin_step(step, first=first)


def test_a_window_failing_on_one_rank_moves_no_rank_s_windows(tmp_path: Path) -> None:
    agreement = LocalAgreement()  # the two coordinators play two ranks of one job
    params = _params(first=2, every_steps=4, window_steps=2)
    ranks = []
    for fail in ("", "start"):
        health = HealthCounters()
        recorder = AttemptLog(fail)
        coordinator = WindowCoordinator(
            schedule=AlignedSchedule(params, agreement, members=2),
            recorder=recorder,
            analyser=WindowAnalyser(
                lambda path: [_step(s) for s in range(20)], temp_dir=str(tmp_path)
            ),
            analysis_timeout_s=60.0,
            health=health,
            log=RateLimitedLog(60.0),
            clock=Clock(),
        )
        ranks.append((coordinator, recorder, health))
    for step in range(20):
        for coordinator, _, _ in ranks:
            coordinator.begin_step(step, allowed=True)
            coordinator.end_step(step)
            coordinator.observe_wall(step, 1.0)
            if coordinator.holds(step) and not coordinator.recording:
                assert _wait_resolved(coordinator) is not None
    (_, healthy, healthy_health), (_, failing, failing_health) = ranks
    assert healthy.attempts == failing.attempts == [2, 6, 10, 14, 18]
    assert healthy_health.snapshot().windows_analysed_total == 5
    assert failing_health.snapshot().profiler_failures_total == 5
