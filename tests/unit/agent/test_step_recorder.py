"""The training thread's step recorder: what a steady step runs, when the slow path is taken,
the ring read by the report thread (periods, step starts, a ring it fell behind on)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from mfuscope.agent._agent import Seams, agent_with_seams
from mfuscope.agent._health import HealthCounters
from mfuscope.agent._step_recorder import CAPACITY, StepRecorder
from mfuscope.core.schema import decode_batch
from torch import nn

from tests.support.agent_fakes import FakeProfiler, jsonl_agent, step_until
from tests.support.step_records import FakeClock, reporter_for, use_recorder_clock
from tests.support.waiting import wait_until

WIDTH = 16


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(WIDTH, WIDTH), nn.ReLU(), nn.Linear(WIDTH, WIDTH))


def _reports(path: Path) -> dict[int, Any]:
    lines = path.read_text().splitlines()
    return {r.step: r for line in lines for r in decode_batch(line).reports}


def test_window_steps_take_the_slow_path_and_the_rest_do_not(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    slow: list[int] = []
    begin_slow = StepRecorder._begin_slow

    def noting(recorder: StepRecorder, given: Any) -> None:
        slow.append(recorder.next_step)
        begin_slow(recorder, given)

    monkeypatch.setattr(StepRecorder, "_begin_slow", noting)
    profiler_calls: list[str] = []
    agent = agent_with_seams(
        Seams(profiler_factory=lambda: FakeProfiler(profiler_calls), analyse=lambda path: []),
        job="unit",
        jsonl_path=str(tmp_path / "out.jsonl"),
        peak_flops=1e11,
        flops_per_step=1e9,
        profile=True,
        profile_first_step=5,
        profile_steps=2,
        profile_every_steps=1000,
        flush_interval_s=60.0,
    )
    # until the (empty) window's analysis is in and has failed
    taken = step_until(agent, lambda health: health.profiler_failures_total > 0)
    for _ in range(50):
        with agent.step():
            pass
    last = taken + 50 - 1  # the first step is step 0
    agent.close()
    assert {5, 6} <= set(slow)  # the window's steps: the profiler starts and stops there
    assert slow[0] == 5  # FLOPs are given: nothing is due before the window
    # after the window: its analysis, the window marked done, the next window's first
    # decisions; then nothing for the 50 steps
    assert max(slow) < last - 40
    assert profiler_calls == ["start", "stop", "export"]  # one window, recorded once
    assert sorted(_reports(tmp_path / "out.jsonl")) == list(range(last + 1))


def test_shape_changes_on_steady_steps_are_counted(tmp_path: Path) -> None:
    model = _model()
    agent = jsonl_agent(tmp_path, model)
    for batch in (4, 4, 8, 8, 4, 8, 8):
        with agent.step():
            model(torch.randn(batch, WIDTH)).sum().backward()
    agent.close()
    reports = _reports(tmp_path / "out.jsonl")
    flops = [reports[step].model_flops for step in range(7)]
    per_row = flops[0] / 4
    assert per_row > 0
    assert flops == [per_row * batch for batch in (4, 4, 8, 8, 4, 8, 8)]


def test_reports_are_shipped_while_training_runs(tmp_path: Path) -> None:
    agent = jsonl_agent(tmp_path, flops_per_step=1e9, flush_interval_s=0.05, max_batch_reports=4)
    path = tmp_path / "out.jsonl"
    for _ in range(9):
        with agent.step():
            pass

    # Before close: the periodic thread reports the 8 steps whose period is known (step 8 ends
    # when a next step begins) and the transport ships them in two batches of 4.
    def shipped() -> list[int]:
        return sorted(_reports(path)) if path.exists() else []

    wait_until(lambda: len(shipped()) >= 8, "the reports shipped before close")
    assert shipped() == list(range(8))
    agent.close()
    assert sorted(_reports(path)) == list(range(9))


class Starts:
    def __init__(self) -> None:
        self.starts: list[tuple[int, int]] = []

    def step_began(self, step: int, start_unix_ns: int) -> None:
        self.starts.append((step, start_unix_ns))


def test_the_collective_reader_gets_every_step_start_on_the_wall_clock(clock: FakeClock) -> None:
    reader = Starts()
    recorder, reporter, _ = reporter_for(clock, wall_offset_ns=5_000, collectives=reader)
    for _ in range(3):
        with recorder:
            clock.now_ns += 100
        clock.now_ns += 10
    reporter.drain()
    assert reader.starts == [
        (0, 1_000_000_000 + 5_000),
        (1, 1_000_000_110 + 5_000),
        (2, 1_000_000_220 + 5_000),
    ]


def test_steps_the_ring_overwrote_before_they_were_read_are_counted(clock: FakeClock) -> None:
    health = HealthCounters()
    recorder, reporter, timed = reporter_for(clock, health=health)
    extra = 100
    for _ in range(CAPACITY + extra):  # the report thread never ran meanwhile
        with recorder:
            clock.now_ns += 1_000_000
    reporter.drain(final=True)
    assert [t.step for t in timed] == list(range(extra, CAPACITY + extra))
    assert reporter.lost_steps == extra
    assert health.snapshot().reports_dropped_total == extra


def test_nested_and_failing_steps_on_the_recorder(clock: FakeClock) -> None:
    recorder, reporter, timed = reporter_for(clock)
    with recorder, recorder:  # the inner one is nested: ignored
        clock.now_ns += 1_000
    with pytest.raises(ZeroDivisionError), recorder:
        _ = 1 / 0
    with recorder:
        clock.now_ns += 1_000
    reporter.drain(final=True)
    assert [t.step for t in timed] == [0, 1, 2]
    assert recorder.depth == 0


def test_a_failing_clock_fails_the_step(monkeypatch: pytest.MonkeyPatch) -> None:
    ticks = iter(range(1_000, 10**9, 1_000))

    def clock() -> int:
        value = next(ticks)
        if value == 5_000:
            raise OSError("clock gone")
        return value

    with use_recorder_clock(monkeypatch, clock):
        recorder, _, _ = reporter_for(clock)
        with recorder:  # first step: slow path (1 000 at enter, 2 000 at exit)
            pass
        with recorder:  # 3 000, 4 000
            pass
        with pytest.raises(OSError, match="clock gone"), recorder:
            pass
    # the step whose start could not be read was not begun
    assert recorder.begun == 2 and recorder.depth == 0


def test_the_ring_holds_each_start_once(clock: FakeClock) -> None:
    recorder, _, _ = reporter_for(clock)
    for _ in range(CAPACITY + 3):
        with recorder:
            clock.now_ns += 1_000
    assert len(recorder.starts) == CAPACITY
    # step n started at 1e9 + 1000 n; slot n % CAPACITY holds the latest step of that slot
    assert recorder.starts[2] == 1_000_000_000 + 1_000 * (CAPACITY + 2)
    assert recorder.starts[3] == 1_000_000_000 + 1_000 * 3
    assert all(sys.getrefcount(start) < 10 for start in recorder.starts[3:8])


def test_agent_step_returns_the_recorder_or_a_given_step(tmp_path: Path) -> None:
    agent = jsonl_agent(tmp_path, flops_per_step=1e9)
    recorder = agent.step()  # one object for every step without FLOPs: nothing made per step
    assert isinstance(recorder, StepRecorder)
    assert agent.step() is recorder and agent.step(None) is recorder
    assert agent.step(recompute_flops=None) is recorder
    with agent.step(5.0):
        pass
    with agent.step(flops=1.0, recompute_flops=2.0):
        pass
    agent.close()
    reports = _reports(tmp_path / "out.jsonl")
    assert [(reports[s].model_flops, reports[s].recompute_flops) for s in (0, 1)] == [
        (5.0, 0.0),
        (1.0, 2.0),
    ]
    with pytest.raises(TypeError):
        agent.step(1.0, 2.0, 3.0)  # type: ignore[call-arg]
