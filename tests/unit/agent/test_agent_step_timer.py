"""Step timing: host-clock periods from the step recorder's ring, and device events read
asynchronously by the report thread (never synchronised, also not at close)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
from mfuscope.agent._agent import Seams, agent_with_seams
from mfuscope.agent._health import HealthCounters, RateLimitedLog
from mfuscope.agent._step_recorder import StepRecorder
from mfuscope.agent._step_reports import StepReporter
from mfuscope.agent._thread_clock import ThreadClock, open_thread_clock
from mfuscope.agent.step_timer import DeviceEventStepTimer, TimedStep
from mfuscope.core.schema import decode_batch

from tests.support.agent_fakes import FakeProfiler
from tests.support.fake_cuda import FakeDevice
from tests.support.step_records import FakeClock, FakeWindows, reporter_for


@pytest.fixture
def clock_start_ns() -> int:
    return 10_000_000_000  # the recorder's clock reads 10 s at the first step


def test_host_periods_run_from_start_to_next_start(clock: FakeClock) -> None:
    recorder, reporter, timed = reporter_for(clock, wall_offset_ns=0)
    with recorder:
        clock.advance(0.5)
    clock.advance(0.25)  # data loading between steps belongs to step 0 (bubble)
    reporter.drain()
    assert timed == []  # step 0's period ends when step 1 begins
    with recorder:
        clock.advance(0.75)
    clock.advance(9.0)  # after the last step: not part of it
    reporter.drain()
    assert timed == [TimedStep(0, 10_000_000_000, 0.75)]
    reporter.drain(final=True)
    assert timed[1:] == [TimedStep(1, 10_750_000_000, 0.75)]
    reporter.drain(final=True)
    assert len(timed) == 2


@pytest.mark.parametrize("steps", [1, 2, 7])
def test_host_clock_reports_every_step_once(clock: FakeClock, steps: int) -> None:
    recorder, reporter, timed = reporter_for(clock)
    for _ in range(steps):
        with recorder:
            clock.advance(0.1)
        reporter.drain()
    reporter.drain(final=True)
    assert [t.step for t in timed] == list(range(steps))
    assert all(t.wall_s == pytest.approx(0.1) for t in timed)


def test_a_step_still_open_at_close_ends_at_close_with_unknown_flops(clock: FakeClock) -> None:
    recorder, reporter, timed = reporter_for(clock)
    with recorder:
        clock.advance(1.0)
    recorder.__enter__()
    clock.advance(2.0)
    recorder.close()
    reporter.drain(final=True)
    assert [(t.step, t.wall_s) for t in timed] == [(0, 1.0), (1, 2.0)]


def _device_recorder(
    ns: FakeClock, device: FakeDevice, **timer_options: Any
) -> tuple[StepRecorder, StepReporter, list[TimedStep], DeviceEventStepTimer]:
    """A recorder on the device path (fake CUDA calls) whose timer reads the recorder's clock
    `ns`, the wall clock 5 us ahead of it."""
    timer = DeviceEventStepTimer(
        device.calls(), clock_ns=ns, wall_clock_ns=lambda: ns() + 5_000, **timer_options
    )
    recorder, reporter, timed = reporter_for(ns, wall_offset_ns=5_000, timer=timer)
    return recorder, reporter, timed, timer


def _periods(timed: list[TimedStep]) -> list[tuple[int, float]]:
    return [(t.step, round(t.wall_s, 6)) for t in timed]


def test_device_timer_reads_events_late_and_never_synchronises(clock: FakeClock) -> None:
    device = FakeDevice()
    waits: list[float] = []

    def sleep(seconds: float) -> None:  # close polls; the device gets on meanwhile
        waits.append(seconds)
        device.run_all()

    recorder, reporter, timed, _ = _device_recorder(clock, device, sleep=sleep)
    for _ in range(4):
        with recorder:
            clock.advance(0.001)
        reporter.drain()
        assert timed == []  # the device has not run anything yet
    # Events per step: start, end (one event, recorded again each step). The device now passes
    # step 0's start, step 1's start, step 2's start (the end event stays pending: recorded last).
    device.run(3, 100.0)
    reporter.drain()
    assert _periods(timed) == [(0, 0.1), (1, 0.1)]
    # each start on the wall clock: the recorder's reading (1 ms apart) + the wall offset
    assert [t.start_unix_ns for t in timed] == [10_000_005_000, 10_001_005_000]
    device.run(1, 50.0)  # step 3's start
    reporter.drain()
    assert _periods(timed[2:]) == [(2, 0.05)]
    assert device.syncs == 0
    assert device.queries > 0
    # close: polls until the device has passed the last step's end, never synchronises
    recorder.close()
    reporter.drain(final=True)
    assert device.syncs == 0 and waits
    assert [t.step for t in timed] == [0, 1, 2, 3]
    assert all(t.wall_s > 0 for t in timed)


def test_device_timer_bounds_pending_steps_and_reuses_events(clock: FakeClock) -> None:
    device = FakeDevice()
    recorder, reporter, timed, timer = _device_recorder(clock, device, max_pending=3)
    for _ in range(5):
        with recorder:
            pass
    reporter.drain()
    assert timed == []
    assert timer.dropped_steps == 2
    device.run_all()
    reporter.drain()
    assert [t.step for t in timed] == [2, 3]
    created = device.created
    for _ in range(5, 50):  # spent start events come back from the report thread
        with recorder:
            pass
        device.run_all()
        reporter.drain()
    assert device.created - created <= 3
    assert [t.step for t in timed] == list(range(2, 49))


def test_device_timer_drops_steps_the_device_has_not_passed_by_the_close_deadline(
    clock: FakeClock,
) -> None:
    device = FakeDevice()
    now = [0.0]

    def sleep(seconds: float) -> None:
        now[0] += seconds  # a hung device: nothing completes

    recorder, reporter, timed, timer = _device_recorder(
        clock, device, close_wait_s=0.05, clock=lambda: now[0], sleep=sleep
    )
    with recorder:
        pass
    recorder.close()
    reporter.drain(final=True)
    assert timed == [] and timer.dropped_steps == 1
    assert device.syncs == 0 and now[0] >= 0.05


def test_the_device_path_records_one_event_per_boundary_on_a_stream_fetched_once(
    clock: FakeClock,
) -> None:
    """No Stream object per step: the current stream is fetched at the first boundary and again
    only when its handle changes; each boundary records one event on it."""
    device = FakeDevice()
    recorder, reporter, timed, _ = _device_recorder(clock, device)
    for _ in range(10):
        with recorder:
            clock.advance(0.001)
        device.run_all()
        reporter.drain()
    assert device.streams_built == 1 and device.records == 20  # a start and an end per step
    device.current = 7  # the job enters `with torch.cuda.stream(side):`
    for _ in range(3):
        with recorder:
            pass
    assert device.streams_built == 2
    assert [e.stream for e in device.pending] == [7, 7, 7, 7]  # three starts, the end
    with recorder:
        device.current = 9  # switched inside a step: its end stays on its start's stream
    assert [e.stream for e in device.pending[-2:]] == [7, 7]
    for _ in range(3):  # marked steps: one event per step (its start ends the step before)
        recorder.mark()
    assert device.streams_built == 3 and device.pending[-1].stream == 9
    assert device.records == 20 + 8 + 3
    recorder.close()  # ends the last marked step: its end event
    assert device.records == 20 + 8 + 3 + 1
    device.run_all()
    reporter.drain(final=True)
    assert [t.step for t in timed] == list(range(17))
    assert device.syncs == 0


def test_a_failing_record_drops_its_steps_and_the_loop_goes_on(clock: FakeClock) -> None:
    device = FakeDevice()
    health = HealthCounters()
    timer = DeviceEventStepTimer(device.calls(), clock_ns=clock, wall_clock_ns=clock)
    recorder, reporter, timed = reporter_for(clock, timer=timer, health=health)
    with recorder:
        clock.advance(0.001)
    device.fail_records = True
    with recorder:  # step 1's start and end fail: counted, never raised
        clock.advance(0.001)
    device.fail_records = False
    for _ in range(3):
        with recorder:
            clock.advance(0.001)
    device.run_all(each_ms=2.0)
    recorder.close()
    reporter.drain(final=True)
    # step 0 has no following start event, step 1 none of its own: both dropped
    assert [t.step for t in timed] == [2, 3, 4]
    assert health.snapshot().reports_dropped_total == 0 and timer.dropped_steps == 2
    assert recorder.depth == 0


def test_agent_on_a_device_never_synchronises_and_reports_device_periods(tmp_path: Path) -> None:
    """The whole agent through the timer seam: steady steps, a profiled window (the fake
    profiler) and close; the fake CUDA boundary counts every synchronisation."""
    device = FakeDevice()

    def sleep(seconds: float) -> None:
        device.run_all(each_ms=10.0)

    timer = DeviceEventStepTimer(device.calls(), sleep=sleep)
    analysed: list[Any] = []
    agent = agent_with_seams(
        Seams(
            timer=timer,
            profiler_factory=FakeProfiler,
            analyse=lambda path: analysed.append(path) or [],
        ),
        job="device",
        jsonl_path=str(tmp_path / "out.jsonl"),
        peak_flops=1e12,
        flops_per_step=1e9,
        profile=True,
        profile_first_step=3,
        profile_steps=2,
        flush_interval_s=60.0,
    )
    for _ in range(12):
        with agent.step():
            pass
        device.run_all(each_ms=10.0)  # the device runs the step: start -> end, end -> next start
    agent.close()
    assert device.syncs == 0
    assert analysed  # the window was profiled (and its analysis failed: no steps in the trace)
    lines = (tmp_path / "out.jsonl").read_text().splitlines()
    reports = {r.step: r for line in lines for r in decode_batch(line).reports}
    assert sorted(reports) == list(range(12))  # the window's steps (3, 4) came after its result
    # start -> end 10 ms, end -> next start 10 ms; the last step ends at its end
    assert [round(reports[s].wall_s, 6) for s in range(12)] == [0.02] * 11 + [0.01]


def test_recorder_slots_and_hot_path_names_match() -> None:
    # The hot path touches only this object's slots: a new attribute there would be a typo.
    recorder = StepRecorder(
        first_step=0, timer=None, health=HealthCounters(), log=RateLimitedLog(60.0)
    )
    recorder.bind(*FakeWindows.flops_and_windows(recorder))
    with recorder:
        pass
    assert not hasattr(recorder, "__dict__")


@pytest.mark.slow  # the real thread clock through a real sleep
def test_on_cpu_a_step_is_blocked_while_its_thread_sleeps_not_while_it_computes() -> None:
    # the real thread clock (Linux schedstat): a sleeping step is blocked for its sleep; a
    # step that spins is not, whatever the machine's load (waiting for a CPU is run delay)
    clock = open_thread_clock()
    if clock is None:
        pytest.skip("no /proc/thread-self/schedstat here")
    recorder, reporter, timed = reporter_for(time.perf_counter_ns, thread_clock=clock)
    with recorder:
        time.sleep(0.03)
    with recorder:
        spin_until = time.thread_time() + 0.03  # 30 ms of this thread's own CPU time
        while time.thread_time() < spin_until:
            pass
    with recorder:
        pass
    reporter.drain()
    sleeping, spinning = timed[0], timed[1]
    assert sleeping.blocked_s is not None and spinning.blocked_s is not None
    assert spinning.run_delay_s is not None and spinning.run_delay_s >= 0
    assert 0.025 <= sleeping.blocked_s <= sleeping.wall_s
    assert spinning.blocked_s < 0.01 < 0.03 <= spinning.wall_s


class _ScriptedClock:
    """A thread clock whose lines the test writes: (CPU ns, run delay ns)."""

    def __init__(self) -> None:
        self.cpu_ns = 1_000
        self.run_delay_ns = 0

    def read(self) -> bytes:
        return f"{self.cpu_ns} {self.run_delay_ns} 7\n".encode()


def test_each_step_reads_the_thread_clock_at_its_start(clock: FakeClock) -> None:
    thread = _ScriptedClock()
    recorder, reporter, timed = reporter_for(clock, thread_clock=thread)  # type: ignore[arg-type]
    # step 0: 10 ms, 4 ms on the CPU, 1 ms waiting for one, so 5 ms blocked
    with recorder:
        clock.advance(0.010)
        thread.cpu_ns += 4_000_000
        thread.run_delay_ns += 1_000_000
    with recorder:  # step 1: 10 ms on the CPU
        clock.advance(0.010)
        thread.cpu_ns += 10_000_000
    with recorder:  # step 2: blocked all along
        clock.advance(0.010)
    with recorder:  # step 3: the last, no reading at its end
        clock.advance(0.010)
    reporter.drain(final=True)
    assert [(t.step, t.blocked_s, t.run_delay_s) for t in timed] == [
        (0, pytest.approx(0.005), pytest.approx(0.001)),
        (1, pytest.approx(0.0), pytest.approx(0.0)),
        (2, pytest.approx(0.010), pytest.approx(0.0)),
        (3, None, None),
    ]


def test_a_clock_that_fails_is_dropped_and_steps_carry_shares(clock: FakeClock) -> None:
    thread = _ScriptedClock()
    recorder, reporter, timed = reporter_for(clock, thread_clock=thread)  # type: ignore[arg-type]
    with recorder:
        clock.advance(0.010)

    def broken() -> bytes:
        raise OSError("gone")

    recorder.read_thread_clock = broken
    with recorder:  # the read fails at this step's start: the step still runs and is timed
        clock.advance(0.010)
    with recorder:
        clock.advance(0.010)
    reporter.drain(final=True)
    assert recorder.read_thread_clock is None and recorder.thread_clock is None
    assert [t.step for t in timed] == [0, 1, 2]
    assert all(t.blocked_s is None for t in timed) and timed[0].wall_s == pytest.approx(0.010)


def test_without_a_thread_clock_steps_have_no_blocked_time(clock: FakeClock) -> None:
    assert open_thread_clock("/nonexistent/schedstat") is None
    recorder, reporter, timed = reporter_for(clock)
    with recorder:
        clock.advance(0.5)
    with recorder:
        clock.advance(0.5)
    reporter.drain()
    assert timed == [TimedStep(0, 10_000_000_000, 0.5, None)]


@pytest.mark.parametrize(
    ("arguments", "env", "read"),
    [
        ({}, {}, True),
        ({"thread_clock": False}, {}, False),
        ({}, {"MFUSCOPE_THREAD_CLOCK": "0"}, False),
    ],
)
def test_the_thread_clock_is_read_on_cpu_unless_turned_off(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    arguments: dict[str, Any],
    env: dict[str, str],
    read: bool,
) -> None:
    if open_thread_clock() is None:
        pytest.skip("no /proc/thread-self/schedstat here")
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    opened: list[object] = []

    def open_clock() -> ThreadClock | None:
        opened.append(clock := open_thread_clock())
        return clock

    agent = agent_with_seams(
        Seams(thread_clock=open_clock),
        job="unit",
        jsonl_path=str(tmp_path / "out.jsonl"),
        profile=False,
        **arguments,
    )
    agent.close()
    # the training thread's clock is opened (then read at each step's start) or never touched
    assert (len(opened) == 1 and opened[0] is not None) is read
