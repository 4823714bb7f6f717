"""The hot path's contract (`_step_recorder`'s docstring), seen by `sys.setprofile` through the
probe validate-gpu runs on a GPU (`mfuscope.agent.hot_path_probe`): what one steady `with
agent.step():` and one steady `agent.mark_step()` run on the training thread, on a CPU timeline
and on the device path with fake CUDA calls (no CUDA here). Nothing but the recorder, the clock
and (per boundary) its device event or thread clock: no lock, no logging, no call into the FLOP
tracker, the window coordinator, the reports, the transports or the timer, no wall-clock read,
no `Stream` built per step."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import torch
from mfuscope.agent._agent import Seams
from mfuscope.agent.hot_path_probe import boundary_calls, boundary_costs, profiled
from mfuscope.agent.step_timer import DeviceEventStepTimer
from mfuscope.core.schema import decode_batch
from torch import nn

from tests.support import fake_cuda
from tests.support.agent_fakes import jsonl_agent
from tests.support.fake_cuda import FakeDevice

WIDTH = 16
CLOCK = ("c_call", "perf_counter_ns")
# A step start on the device path: one pooled event, the stream's handle, one record.
DEVICE_START = (("c_call", "pop"), ("call", "raw_stream"), ("call", "record"))
DEVICE_END = (("call", "record"),)  # on the stream of the step's start


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(WIDTH, WIDTH), nn.ReLU(), nn.Linear(WIDTH, WIDTH))


def _steps(path: Path) -> list[int]:
    lines = path.read_text().splitlines()
    return sorted(r.step for line in lines for r in decode_batch(line).reports)


def test_steady_boundaries_on_a_cpu_timeline_run_only_the_recorder_and_the_clock(
    tmp_path: Path,
) -> None:
    """On this CPU timeline the thread clock's `pread` also runs at each step's start: a C
    partial, which the profiler does not see as a call of its own."""
    model = _model()
    inputs = torch.randn(4, WIDTH)
    agent = jsonl_agent(tmp_path, model, profile=True, profile_first_step=1000)
    seen = boundary_calls(agent, lambda: model(inputs).sum().backward())
    clock_read = agent._recorder is not None and agent._recorder.read_thread_clock is not None
    agent.close()
    assert clock_read
    assert seen.entering == (("call", "step"), ("call", "__enter__"), CLOCK)
    assert seen.leaving == (("call", "__exit__"), CLOCK)
    # one call for both boundaries: the end of the step before and the start of the next
    assert seen.marking == (("call", "mark_step"), ("call", "mark"), CLOCK)
    assert _steps(tmp_path / "out.jsonl") == list(range(8))  # 4 with-steps, 4 marked


def test_steady_boundaries_on_the_device_path_record_one_pooled_event_each(
    tmp_path: Path,
) -> None:
    """The device path with fake CUDA calls (`tests/support/fake_cuda.py`): per boundary one
    event from the pool recorded on the stream fetched once; no frame of the timer's, no
    `torch.cuda.current_stream()`, no wall-clock read, never a synchronisation."""
    device = FakeDevice()
    timer = DeviceEventStepTimer(device.calls(), sleep=lambda seconds: device.run_all())
    # spent events the periodic thread would have handed back by now (the first steps create
    # them; here the pool is filled up front so that the profiled boundaries find one)
    timer.pool.extend(device.new_event() for _ in range(32))
    model = _model()
    inputs = torch.randn(4, WIDTH)

    def work() -> None:
        model(inputs).sum().backward()
        device.run_all()

    agent = jsonl_agent(tmp_path, model, seams=Seams(timer=timer))
    seen = boundary_calls(agent, work, opaque=fake_cuda.__file__)  # the fakes stand for C calls
    agent.close()
    assert seen.entering == (("call", "step"), ("call", "__enter__"), CLOCK, *DEVICE_START)
    assert seen.leaving == (("call", "__exit__"), CLOCK, *DEVICE_END)
    assert seen.marking == (("call", "mark_step"), ("call", "mark"), CLOCK, *DEVICE_START)
    assert device.streams_built == 1 and device.syncs == 0
    assert device.created == 32 + 1  # the pool's and the end event: none per step
    assert _steps(tmp_path / "out.jsonl") == list(range(8))


def test_what_the_device_path_replaced_shows_up_in_the_probe() -> None:
    """The probe sees what the contract forbids: a Python frame of torch's `Event.record`-like
    wrapper that asks for the current stream and reads the wall clock (the path before)."""
    device = FakeDevice()

    def record_like_torch(event: Any) -> None:  # torch.cuda.Event.record without a stream
        device.record(event, device.stream())
        time.time_ns()

    seen = profiled(lambda: record_like_torch(device.new_event()), opaque=fake_cuda.__file__)
    assert ("call", "stream") in seen and ("c_call", "time_ns") in seen


def test_the_cost_probe_times_every_mode_apart_from_each_agents_first_step(
    tmp_path: Path,
) -> None:
    for name in ("step", "mark"):
        (tmp_path / name).mkdir()
    step_agent = jsonl_agent(tmp_path / "step", flops_per_step=1e9)
    mark_agent = jsonl_agent(tmp_path / "mark", flops_per_step=1e9)
    ticks = iter(range(10**9))
    costs = boundary_costs(
        lambda: None,
        step_agent=step_agent,
        mark_agent=mark_agent,
        rounds=3,
        block=4,
        clock=lambda: float(next(ticks)),  # each reading one tick after the one before
    )
    step_agent.close()
    mark_agent.close()
    assert [len(costs.of(mode)) for mode in ("floor", "step", "mark")] == [12, 11, 11]
    # with a clock that ticks once per reading: two ticks inside a `with`, one inside a mark
    assert set(costs.of("floor")) == set(costs.of("step")) == {2.0}
    assert set(costs.of("mark")) == {1.0}
    assert costs.ratio("step") == 1.0 and costs.p99_s("mark") == 1.0
    assert _steps(tmp_path / "step" / "out.jsonl") == list(range(12))
    assert _steps(tmp_path / "mark" / "out.jsonl") == list(range(12))
