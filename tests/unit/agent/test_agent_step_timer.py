"""Step timers: host clock periods, and device events read asynchronously (never synchronised)."""

from __future__ import annotations

import pytest
from mfuscope.agent.step_timer import DeviceEventStepTimer, HostStepTimer, TimedStep


class FakeClock:
    def __init__(self) -> None:
        self.now = 10.0

    def __call__(self) -> float:
        return self.now


def test_host_timer_measures_period_from_start_to_next_start() -> None:
    clock = FakeClock()
    timer = HostStepTimer(clock=clock, wall_clock_ns=lambda: int(clock.now * 1e9))
    timer.begin(0)
    clock.now += 0.5
    timer.end(0)
    clock.now += 0.25  # data loading between steps belongs to step 0 (bubble)
    assert timer.poll() == []
    timer.begin(1)
    clock.now += 0.75
    timer.end(1)
    clock.now += 9.0  # after the last step: not part of it
    assert timer.poll() == [TimedStep(0, 10_000_000_000, 0.75)]
    assert timer.finish() == [TimedStep(1, 10_750_000_000, 0.75)]
    assert timer.finish() == []


class FakeEvent:
    """Stands in for torch.cuda.Event: `done` is flipped by the fake device."""

    def __init__(self, device: FakeDevice) -> None:
        self.device = device
        self.time_ms: float | None = None
        self.done = False

    def record(self) -> None:
        self.device.recorded.append(self)

    def query(self) -> bool:
        self.device.queries += 1
        return self.done

    def elapsed_time(self, end_event: FakeEvent) -> float:
        assert self.done and end_event.done, "elapsed_time on an event the device has not passed"
        assert self.time_ms is not None and end_event.time_ms is not None
        return end_event.time_ms - self.time_ms

    def synchronize(self) -> None:
        self.device.syncs += 1
        self.device.run_all()


class FakeDevice:
    def __init__(self) -> None:
        self.recorded: list[FakeEvent] = []
        self.queries = 0
        self.syncs = 0
        self.clock_ms = 0.0

    def new_event(self) -> FakeEvent:
        return FakeEvent(self)

    def run(self, count: int, each_ms: float) -> None:
        """The device passes the next `count` recorded events, `each_ms` apart."""
        pending = [e for e in self.recorded if not e.done][:count]
        for event in pending:
            self.clock_ms += each_ms
            event.time_ms = self.clock_ms
            event.done = True

    def run_all(self) -> None:
        self.run(len(self.recorded), 1.0)


def test_device_timer_reads_events_late_and_never_synchronises() -> None:
    device = FakeDevice()
    timer = DeviceEventStepTimer(device.new_event, wall_clock_ns=lambda: 5)
    for step in range(4):
        timer.begin(step)
        timer.end(step)
        assert timer.poll() == []  # the device has not run anything yet
    # Events per step: start, end. The device now passes step 0's start, step 0's end and
    # step 1's start, 100 ms apart.
    device.run(3, 100.0)
    done = timer.poll()
    assert [(t.step, round(t.wall_s, 6)) for t in done] == [(0, 0.2)]
    device.run(2, 50.0)  # step 1's end, step 2's start
    assert [(t.step, round(t.wall_s, 6)) for t in timer.poll()] == [(1, 0.1)]
    assert device.syncs == 0
    assert device.queries > 0
    # close: waits for the device once, then the last step ends at its own end event
    closing = timer.finish()
    assert device.syncs == 1
    assert [t.step for t in closing] == [2, 3]
    assert all(t.wall_s > 0 for t in closing)


def test_device_timer_bounds_pending_steps() -> None:
    device = FakeDevice()
    timer = DeviceEventStepTimer(device.new_event, max_pending=3)
    for step in range(5):
        timer.begin(step)
    assert timer.dropped_steps == 2
    device.run_all()
    assert [t.step for t in timer.poll()] == [2, 3]


@pytest.mark.parametrize("steps", [1, 2, 7])
def test_host_timer_reports_every_step_once(steps: int) -> None:
    clock = FakeClock()
    timer = HostStepTimer(clock=clock)
    seen: list[int] = []
    for step in range(steps):
        timer.begin(step)
        clock.now += 0.1
        timer.end(step)
        seen += [t.step for t in timer.poll()]
    seen += [t.step for t in timer.finish()]
    assert seen == list(range(steps))
