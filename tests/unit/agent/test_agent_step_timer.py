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
from mfuscope.agent.step_timer import DeviceEventStepTimer, TimedStep
from mfuscope.agent.thread_clock import ThreadClock, open_thread_clock
from mfuscope.core.schema import batch_from_json

from tests.support.agent_fakes import FakeProfiler
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


class FakeEvent:
    """Stands in for torch.cuda.Event: `done` is set by the fake device; recording again makes
    it pending again, as on CUDA."""

    def __init__(self, device: FakeDevice) -> None:
        self.device = device
        self.time_ms: float | None = None
        self.done = False

    def record(self) -> None:
        self.done, self.time_ms = False, None
        if self in self.device.pending:
            self.device.pending.remove(self)
        self.device.pending.append(self)

    def query(self) -> bool:
        self.device.queries += 1
        return self.done

    def elapsed_time(self, end_event: FakeEvent) -> float:
        # A real event raises here when not completed; the timer must never ask.
        assert self.done and end_event.done, "elapsed_time on an event the device has not passed"
        assert self.time_ms is not None and end_event.time_ms is not None
        return end_event.time_ms - self.time_ms

    def synchronize(self) -> None:
        self.device.syncs += 1
        self.device.run_all()


class FakeDevice:
    """The CUDA boundary: events it creates, passes in order, and the synchronisations asked."""

    def __init__(self) -> None:
        self.pending: list[FakeEvent] = []
        self.created = 0
        self.queries = 0
        self.syncs = 0
        self.clock_ms = 0.0

    def new_event(self) -> FakeEvent:
        self.created += 1
        return FakeEvent(self)

    def run(self, count: int, each_ms: float) -> None:
        """The device passes the next `count` recorded events, `each_ms` apart."""
        for event in self.pending[:count]:
            self.clock_ms += each_ms
            event.time_ms = self.clock_ms
            event.done = True
        del self.pending[:count]

    def run_all(self, each_ms: float = 1.0) -> None:
        self.run(len(self.pending), each_ms)


def test_device_timer_reads_events_late_and_never_synchronises() -> None:
    device = FakeDevice()
    waits: list[float] = []

    def sleep(seconds: float) -> None:  # close polls; the device gets on meanwhile
        waits.append(seconds)
        device.run_all()

    timer = DeviceEventStepTimer(device.new_event, wall_clock_ns=lambda: 5, sleep=sleep)
    for step in range(4):
        timer.begin(step)
        timer.end(step)
        assert timer.poll() == []  # the device has not run anything yet
    # Events per step: start, end (one event, recorded again each step). The device now passes
    # step 0's start, step 1's start, step 2's start (the end event stays pending: recorded last).
    device.run(3, 100.0)
    done = timer.poll()
    assert [(t.step, round(t.wall_s, 6)) for t in done] == [(0, 0.1), (1, 0.1)]
    device.run(1, 50.0)  # step 3's start
    assert [(t.step, round(t.wall_s, 6)) for t in timer.poll()] == [(2, 0.05)]
    assert device.syncs == 0
    assert device.queries > 0
    # close: polls until the device has passed the last step's end, never synchronises
    closing = timer.finish()
    assert device.syncs == 0 and waits
    assert [t.step for t in closing] == [3]
    assert all(t.wall_s > 0 for t in closing)


def test_device_timer_bounds_pending_steps_and_reuses_events() -> None:
    device = FakeDevice()
    timer = DeviceEventStepTimer(device.new_event, max_pending=3)
    for step in range(5):
        timer.begin(step)
    assert timer.poll() == []
    assert timer.dropped_steps == 2
    device.run_all()
    assert [t.step for t in timer.poll()] == [2, 3]
    created = device.created
    for step in range(5, 50):  # spent start events come back from the report thread
        timer.begin(step)
        timer.end(step)
        device.run_all()
        timer.poll()
    assert device.created - created <= 3


def test_device_timer_drops_steps_the_device_has_not_passed_by_the_close_deadline() -> None:
    device = FakeDevice()
    now = [0.0]

    def sleep(seconds: float) -> None:
        now[0] += seconds  # a hung device: nothing completes

    timer = DeviceEventStepTimer(
        device.new_event, close_wait_s=0.05, clock=lambda: now[0], sleep=sleep
    )
    timer.begin(0)
    timer.end(0)
    assert timer.finish() == [] and timer.dropped_steps == 1
    assert device.syncs == 0 and now[0] >= 0.05


def test_agent_on_a_device_never_synchronises_and_reports_device_periods(tmp_path: Path) -> None:
    """The whole agent through the timer seam: steady steps, a profiled window (the fake
    profiler) and close; the fake CUDA boundary counts every synchronisation."""
    device = FakeDevice()

    def sleep(seconds: float) -> None:
        device.run_all(each_ms=10.0)

    timer = DeviceEventStepTimer(device.new_event, sleep=sleep)
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
    reports = {r.step: r for line in lines for r in batch_from_json(line).reports}
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
