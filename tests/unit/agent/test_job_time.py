"""The rank's own part of the job-time ledger: phases out of the steps' periods, startup and
shutdown, exact in nanoseconds on a scripted clock; `agent.phase()` and the process start."""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

import pytest
import torch
from mfuscope.agent import _phases
from mfuscope.agent._health import HealthCounters, RateLimitedLog
from mfuscope.agent._job_time import JobTime
from mfuscope.agent._phases import Phase
from mfuscope.agent._process_start import process_start_unix_ns, start_from_proc
from mfuscope.agent._step_recorder import StepRecorder
from mfuscope.agent._step_reports import StepReporter
from mfuscope.agent.step_timer import DeviceEventStepTimer, TimedStep
from mfuscope.core.ledger import AGENT_CATEGORIES, wall_ns
from mfuscope.core.schema import decode_batch

from tests.support.agent_fakes import jsonl_agent
from tests.support.fake_cuda import FakeDevice, FakeEvent, FakeStream
from tests.support.step_records import CollectingAssembler, FakeClock, FakeWindows

START_NS = 1_000_000_000  # the clock fixture's first reading
MS = 1_000_000


@dataclasses.dataclass
class Rank:
    """A recorder, its reporter with the ledger, and what they hand on."""

    recorder: StepRecorder
    reporter: StepReporter
    job_time: JobTime
    timed: list[TimedStep]
    log: RateLimitedLog

    def phase(self, name: str) -> Phase:
        return Phase(self.recorder, name, self.log)

    def totals(self) -> dict[str, int]:
        return dict(zip(AGENT_CATEGORIES, self.job_time.totals.totals_ns(), strict=True))

    def periods_ns(self) -> list[int]:
        return [wall_ns(t.wall_s) for t in self.timed]


class LaggingDevice(FakeDevice):
    """A fake GPU that passes each event as it is recorded, at the host's time plus a lag that
    grows by `extra_ns` per step start: each device period is the host's plus `extra_ns` (a GPU
    that runs behind)."""

    def __init__(self, clock: FakeClock, extra_ns: int) -> None:
        super().__init__()
        self.clock, self.extra_ns, self.starts = clock, extra_ns, 0
        self.end_event: FakeEvent | None = None  # the recorder's reused end event

    def record(self, event: FakeEvent, stream: FakeStream) -> None:
        super().record(event, stream)
        if event is not self.end_event:
            self.starts += 1
        event.time_ms = (self.clock.now_ns + self.starts * self.extra_ns) / 1e6
        event.done = True
        self.pending.remove(event)


def _device_timer(clock: FakeClock, extra_ns: int) -> DeviceEventStepTimer:
    device = LaggingDevice(clock, extra_ns)
    calls = device.calls()
    new_event = calls.new_event

    def first_event_is_the_end() -> FakeEvent:  # the recorder makes its reused end event first
        event = new_event()
        if device.end_event is None:
            device.end_event = event
        return event

    calls = dataclasses.replace(calls, new_event=first_event_is_the_end)
    return DeviceEventStepTimer(calls, clock_ns=clock, wall_clock_ns=lambda: clock() + 5_000)


def _rank(
    clock: FakeClock, process_start_ns: int, timer: DeviceEventStepTimer | None = None
) -> Rank:
    health, log = HealthCounters(), RateLimitedLog(60.0)
    recorder = StepRecorder(first_step=0, timer=timer, health=health, log=log)
    flops, windows = FakeWindows.flops_and_windows(recorder)
    recorder.bind(flops, windows)
    job_time = JobTime(recorder, process_start_ns, process_start_ns + 5_000)
    assembler = CollectingAssembler()
    reporter = StepReporter(
        recorder,
        assembler=assembler,  # type: ignore[arg-type]
        windows=windows,
        ship=lambda reports: None,
        health=health,
        log=log,
        timer=timer,
        job_time=job_time,
        clock_ns=clock,
        wall_clock_ns=lambda: clock() + 5_000,
    )
    return Rank(recorder, reporter, job_time, assembler.timed, log)


@pytest.fixture
def phase_clock(monkeypatch: pytest.MonkeyPatch, clock: FakeClock) -> FakeClock:
    """`clock`, read by `agent.phase()` too."""
    monkeypatch.setattr(_phases, "perf_counter_ns", clock)
    return clock


def test_phases_leave_the_steps_and_the_ledger_tiles_the_process(phase_clock: FakeClock) -> None:
    clock = phase_clock
    rank = _rank(clock, START_NS - 3_000 * MS)  # the process started 3 s before this clock
    with rank.phase("checkpoint_load"):  # before the first step: out of startup
        clock.now_ns += 700 * MS
    clock.now_ns += 50 * MS
    for step in range(4):
        with rank.recorder:
            clock.now_ns += 100 * MS
        clock.now_ns += 5 * MS  # unmarked time between steps: the step's
        if step == 1:
            with rank.phase("checkpoint_save"):
                clock.now_ns += 400 * MS
            clock.now_ns += 2 * MS  # unmarked after the phase: still the step's
            with rank.phase("evaluation"):
                clock.now_ns += 300 * MS
        if step == 2:
            with rank.phase("my-own-name"):
                clock.now_ns += 30 * MS
    rank.reporter.drain()
    assert rank.periods_ns() == [105 * MS, 107 * MS, 105 * MS]  # the last one waits for close
    with rank.phase("checkpoint_save"):  # after the last step: out of shutdown
        clock.now_ns += 250 * MS
    clock.now_ns += 20 * MS
    rank.reporter.drain(final=True)
    assert rank.periods_ns() == [105 * MS, 107 * MS, 105 * MS, 100 * MS]
    assert rank.totals() == {
        "startup": 3_050 * MS,
        "checkpoint_save": 650 * MS,
        "checkpoint_load": 700 * MS,
        "evaluation": 300 * MS,
        "other_phase": 30 * MS,
        "shutdown": 25 * MS,  # 5 ms after the last step's end, 20 ms after the phase
    }
    assert sum(rank.periods_ns()) + sum(rank.totals().values()) == clock.now_ns - (
        START_NS - 3_000 * MS
    )
    assert rank.job_time.totals.process_start_unix_ns == START_NS - 3_000 * MS + 5_000


def test_a_phase_between_two_marks_leaves_the_marked_step(phase_clock: FakeClock) -> None:
    # for batch in loader: agent.mark_step(); train(); every other step: with agent.phase(...)
    clock = phase_clock
    rank = _rank(clock, START_NS)
    for step in range(3):
        rank.recorder.mark()
        clock.now_ns += 100 * MS
        if step == 1:
            with rank.phase("evaluation"):
                clock.now_ns += 400 * MS
            clock.now_ns += 3 * MS  # unmarked after the phase: still the step's
    rank.recorder.close()  # ends the last marked step
    rank.reporter.drain(final=True)
    assert rank.periods_ns() == [100 * MS, 103 * MS, 100 * MS]
    assert rank.totals()["evaluation"] == 400 * MS


def test_totals_grow_as_regions_close_and_shutdown_grows_at_each_final_drain(
    clock: FakeClock,
) -> None:
    rank = _rank(clock, START_NS)
    clock.now_ns += 200 * MS
    rank.reporter.drain()
    assert rank.totals()["startup"] == 0  # no step yet: startup is still open
    with rank.recorder:
        clock.now_ns += 10 * MS
    rank.reporter.drain()
    assert rank.totals()["startup"] == 200 * MS
    rank.reporter.drain()  # a drain before the second step books nothing again
    assert rank.totals()["startup"] == 200 * MS
    rank.phase("evaluation").record(clock.now_ns, clock.now_ns + 40 * MS)  # timed elsewhere
    clock.now_ns += 100 * MS
    rank.reporter.drain(final=True)
    assert rank.totals()["evaluation"] == 40 * MS
    assert rank.totals()["shutdown"] == 60 * MS
    clock.now_ns += 7 * MS
    rank.reporter.drain(final=True)  # the agent's second drain at close
    assert rank.totals()["shutdown"] == 67 * MS


def test_a_process_without_steps_is_all_startup_and_phases(clock: FakeClock) -> None:
    rank = _rank(clock, START_NS - 1_000 * MS)
    rank.phase("checkpoint_load").record(clock.now_ns, clock.now_ns + 300 * MS)
    clock.now_ns += 500 * MS
    rank.reporter.drain(final=True)
    assert rank.totals()["startup"] == 1_200 * MS
    assert rank.totals()["checkpoint_load"] == 300 * MS
    assert rank.totals()["shutdown"] == 0


def test_overlapping_phases_count_once_the_earlier_keeps_the_overlap(clock: FakeClock) -> None:
    rank = _rank(clock, START_NS)
    with rank.recorder:
        clock.now_ns += 10 * MS
    t = clock.now_ns
    rank.phase("checkpoint_save").record(t + 10 * MS, t + 30 * MS)  # inside the evaluation
    rank.phase("evaluation").record(t, t + 50 * MS)
    rank.phase("other").record(t + 40 * MS, t + 80 * MS)
    clock.now_ns += 100 * MS
    with rank.recorder:
        clock.now_ns += 10 * MS
    rank.reporter.drain(final=True)
    assert rank.totals()["evaluation"] == 50 * MS
    assert rank.totals()["checkpoint_save"] == 0
    assert rank.totals()["other_phase"] == 30 * MS
    assert rank.periods_ns()[0] == 110 * MS - 80 * MS


def test_a_phase_inside_a_step_or_around_steps_is_left_out(phase_clock: FakeClock) -> None:
    clock = phase_clock
    rank = _rank(clock, START_NS)
    with rank.recorder:
        with rank.phase("evaluation"):  # part of the step
            clock.now_ns += 10 * MS
        clock.now_ns += 10 * MS
    with rank.phase("evaluation"):  # steps inside: no phase
        with rank.recorder:
            clock.now_ns += 10 * MS
        clock.now_ns += 10 * MS
    rank.reporter.drain(final=True)
    assert rank.periods_ns() == [20 * MS, 10 * MS]  # the last step ends at its own end
    assert rank.totals()["evaluation"] == 0
    assert rank.totals()["shutdown"] == 10 * MS


def test_a_step_cut_by_a_phase_carries_no_thread_times(clock: FakeClock) -> None:
    rank = _rank(clock, START_NS)
    for _ in range(3):
        with rank.recorder:
            clock.now_ns += 10 * MS
    rank.phase("checkpoint_save").record(clock.now_ns, clock.now_ns + 5 * MS)
    clock.now_ns += 5 * MS
    with rank.recorder:
        clock.now_ns += 10 * MS
    rank.reporter.drain(final=True)
    assert [t.blocked_s for t in rank.timed] == [None] * 4  # no thread clock here at all
    assert rank.periods_ns() == [10 * MS, 10 * MS, 10 * MS, 10 * MS]


def test_on_a_device_timeline_a_step_loses_its_phases_host_time(clock: FakeClock) -> None:
    timer = _device_timer(clock, extra_ns=3 * MS)
    rank = _rank(clock, START_NS, timer)
    for step in range(3):
        with rank.recorder:
            clock.now_ns += 100 * MS
        if step == 0:
            rank.phase("checkpoint_save").record(clock.now_ns, clock.now_ns + 40 * MS)
            clock.now_ns += 40 * MS
    rank.reporter.drain()
    # the device's periods (host + 3 ms) less the phase's host time
    assert rank.periods_ns() == [103 * MS, 103 * MS]
    assert rank.totals()["checkpoint_save"] == 40 * MS


def test_the_process_start_from_proc_text() -> None:
    # field 22 (starttime) is counted after the last ')': a command may hold spaces and ')'
    stat = "4242 (a b) c) S " + " ".join(["0"] * 18) + " 1000 123 456"
    assert start_from_proc(stat, "60.50 100.0\n", 100, 10**18) == 10**18 - 50_500_000_000
    with pytest.raises(ValueError):
        start_from_proc(stat, "5.0 1.0", 100, 10**18)  # a start after now
    with pytest.raises(IndexError):
        start_from_proc("1 (x) S 2", "5.0 1.0", 100, 10**18)


def test_the_process_start_of_this_process_and_without_proc(tmp_path: Path) -> None:
    start = process_start_unix_ns()
    assert start is not None and start <= time.time_ns()
    assert process_start_unix_ns(str(tmp_path)) is None  # no /proc there


def test_an_agent_sends_its_ledger_with_every_batch_and_phases_with_no_effect_off(
    tmp_path: Path,
) -> None:
    agent = jsonl_agent(tmp_path, flops_per_step=1e9)
    saved_within_ns = 0
    for step in range(3):
        with agent.step():
            pass
        if step == 1:
            before = time.perf_counter_ns()
            with agent.phase("checkpoint_save"):
                torch.save({"w": torch.ones(256, 256)}, tmp_path / "checkpoint.pt")
            saved_within_ns = time.perf_counter_ns() - before
    agent.close()
    batches = [decode_batch(line) for line in (tmp_path / "out.jsonl").read_text().splitlines()]
    ledger = batches[-1].ledger
    assert ledger is not None and batches[-1].closing
    assert 0 < ledger.checkpoint_save_ns <= saved_within_ns
    assert ledger.startup_ns > 0 and ledger.shutdown_ns > 0
    steps = [r for b in batches for r in b.reports]
    span = sum(wall_ns(r.wall_s) for r in steps) + sum(ledger.totals_ns())
    # the ledger ends at the agent's last drain, inside close()
    assert ledger.process_start_unix_ns + span <= time.time_ns()
    off = jsonl_agent(tmp_path, enabled=False)
    with off.phase("evaluation"):
        pass
