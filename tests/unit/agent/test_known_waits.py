"""The blocked time the agent can name on the training thread: a data loader's fetch, its own
profiler's start, stop and export (scripted clocks)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from mfuscope.agent._health import HealthCounters, RateLimitedLog
from mfuscope.agent._known_waits import KnownWaits, install_dataloader
from mfuscope.agent._profiler_windows import WindowAnalyser, WindowRecorder
from mfuscope.agent._window_coordinator import WindowCoordinator
from mfuscope.agent._window_schedule import AlignedSchedule, LocalAgreement, ScheduleParams

from tests.support.agent_fakes import Decomposition, FakeProfiler


class Script:
    """A thread clock and a wall clock that move by what the code under test is said to do:
    each `spend(wall, cpu, delay)` (ns) moves them on before the next reading."""

    def __init__(self) -> None:
        self.cpu = self.delay = self.now = 0
        self.fail = False

    def read(self) -> bytes:
        if self.fail:
            raise OSError("gone")
        return f"{self.cpu} {self.delay} 1\n".encode()

    def clock_ns(self) -> int:
        return self.now

    def spend(self, wall: int, cpu: int = 0, delay: int = 0) -> None:
        self.now += wall
        self.cpu += cpu
        self.delay += delay


def _waits(script: Script, begun: list[int], first_step: int = 0) -> KnownWaits:
    return KnownWaits(script.read, lambda: begun[0], first_step, clock_ns=script.clock_ns)


def test_a_call_s_blocked_time_goes_to_the_step_in_progress() -> None:
    script, begun = Script(), [3]  # step index 2 in progress
    waits = _waits(script, begun)
    # 10 us of wall: 2 us on a CPU, 0.5 us waiting for one, 7.5 us blocked
    assert waits.around(lambda: script.spend(10_000, cpu=2_000, delay=500) or "batch") == "batch"
    waits.around(lambda: script.spend(1_000, cpu=1_000))  # all CPU: nothing blocked
    assert waits.blocked_s(2) == pytest.approx(7.5e-6)
    assert waits.blocked_s(1) == 0.0 and waits.blocked_s(3) == 0.0
    # a later fetch in the same step adds to it; in the next step, to that one
    waits.around(lambda: script.spend(3_000))
    begun[0] = 4
    waits.around(lambda: script.spend(4_000))
    assert waits.blocked_s(2) == pytest.approx(10.5e-6)
    assert waits.blocked_s(3) == pytest.approx(4e-6)


def test_a_named_step_takes_the_time_and_slots_are_reused_around_the_ring() -> None:
    script, begun = Script(), [1]
    waits = _waits(script, begun, first_step=100)
    waits.around(lambda: script.spend(5_000), step=101)  # the profiler's start of step 101
    assert waits.blocked_s(1) == pytest.approx(5e-6)
    begun[0] = 2 + 4096  # a ring later, step index 4097 has the same slot
    waits.around(lambda: script.spend(2_000))
    assert waits.blocked_s(4097) == pytest.approx(2e-6)
    assert waits.blocked_s(1) == 0.0  # overwritten, not added to


def test_nested_calls_count_once_and_failures_measure_nothing_but_still_run() -> None:
    script, begun = Script(), [1]
    waits = _waits(script, begun)

    def outer() -> None:
        script.spend(1_000)
        waits.around(lambda: script.spend(2_000))  # a loader whose dataset reads a loader

    waits.around(outer)
    assert waits.blocked_s(0) == pytest.approx(3e-6)
    with pytest.raises(ValueError, match="dataset"):
        waits.around(lambda: (script.spend(4_000), _raise(ValueError("dataset")))[0])
    assert waits.blocked_s(0) == pytest.approx(7e-6)  # measured all the same
    script.fail = True
    assert waits.around(lambda: "ran") == "ran"
    assert waits.blocked_s(0) == pytest.approx(7e-6)


def _raise(exc: Exception) -> None:
    raise exc


def test_calls_on_another_thread_are_not_measured() -> None:
    script, begun = Script(), [1]
    waits = _waits(script, begun)
    done: list[str] = []
    thread = threading.Thread(target=lambda: done.append(waits.around(lambda: "elsewhere")))
    reads = []
    script.read = lambda: reads.append(1) or b"0 0 1\n"  # type: ignore[method-assign]
    thread.start()
    thread.join()
    assert done == ["elsewhere"] and reads == []


def test_every_data_loader_fetch_is_measured_until_unwrapped() -> None:
    torch_data = pytest.importorskip("torch.utils.data")
    script, begun = Script(), [1]
    waits = _waits(script, begun)

    class Slow(torch_data.Dataset):  # type: ignore[misc]
        def __len__(self) -> int:
            return 3

        def __getitem__(self, item: int) -> int:
            script.spend(1_000_000 * (item + 1))  # blocked 1, 2, 3 ms
            return item

    loader = torch_data.DataLoader(Slow(), batch_size=None)
    unwrap = install_dataloader(waits)
    try:
        assert install_dataloader(waits)() is None  # already wrapped: nothing to undo
        assert list(loader) == [0, 1, 2]
        assert waits.blocked_s(0) == pytest.approx(6e-3)
        assert waits.data_s(0) == pytest.approx(6e-3)  # waiting for data: idle
    finally:
        unwrap()
    assert list(loader) == [0, 1, 2]
    assert waits.blocked_s(0) == pytest.approx(6e-3)  # no longer measured


def _window_coordinator(
    analyser: WindowAnalyser, waits: KnownWaits, profiler: Callable[[], FakeProfiler]
) -> WindowCoordinator:
    params = ScheduleParams(
        first_window_step=2, every_steps=100, every_s=1e9, window_steps=2, max_overhead_ratio=1.0
    )
    return WindowCoordinator(
        schedule=AlignedSchedule(params, LocalAgreement()),
        recorder=WindowRecorder(profiler, annotate=_no_range),
        analyser=analyser,
        analysis_timeout_s=60.0,
        health=HealthCounters(),
        log=RateLimitedLog(60.0),
        clock=lambda: 0.0,
        known_waits=waits,
    )


def _no_range(name: str) -> Any:
    import contextlib

    @contextlib.contextmanager
    def nothing() -> Iterator[None]:
        yield

    return nothing()


def test_a_window_s_profiler_start_stop_and_export_are_named_on_their_steps(
    tmp_path: Path,
) -> None:
    script, begun = Script(), [0]
    waits = _waits(script, begun)
    log: list[str] = []

    class Blocking(FakeProfiler):
        def start(self) -> None:
            script.spend(3_000_000)  # waits 3 ms for the profiler's threads
            super().start()

        def export_chrome_trace(self, path: str) -> None:
            script.spend(5_000_000, cpu=1_000_000)  # holds a lock 4 ms
            super().export_chrome_trace(path)

    def analyse(path: str) -> list[Any]:
        log.append("analyse")
        return [Decomposition(step=s, wall_s=1.0, compute_s=1.0) for s in (2, 3)]

    analyser = WindowAnalyser(analyse, temp_dir=str(tmp_path))
    coordinator = _window_coordinator(analyser, waits, lambda: Blocking(log))
    for step in range(5):
        begun[0] = step + 1
        coordinator.begin_step(step, allowed=True)
        coordinator.end_step(step)
    # the stopped profiler's trace is exported on this thread, then analysed off it
    assert log[:3] == ["start", "stop", "export"]
    assert waits.blocked_s(2) == pytest.approx(3e-3)
    assert waits.blocked_s(3) == pytest.approx(4e-3)
    assert waits.blocked_s(4) == 0.0
    assert waits.data_s(2) == waits.data_s(3) == 0.0  # the profiler's, not waiting for data
    result = coordinator.wait(10.0)
    assert result is not None and [d.step for d in result.decompositions] == [2, 3]
    assert log[-1] == "analyse"
    assert list(tmp_path.iterdir()) == []  # the exported file is gone once analysed
    analyser.close(1.0)
