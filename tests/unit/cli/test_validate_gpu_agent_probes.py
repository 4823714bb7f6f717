"""validate-gpu's agent probes (`_agent_probes`, `_agent_report`) without a GPU: the checks from
hand-built figures (each can fail), and the probes themselves on a simulated device
(`tests/support/simulated_gpu.py`: CUDA events, the agent's step timer and its profiled windows
on one simulated stream) with the real agent. On the simulated device the agent's figures equal
the events' exactly, so the probes' plumbing is what is checked; a device whose window analysis
misreads communication, and CUDA calls that build a stream per record, make them fail."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
from mfuscope.agent.step_timer import DeviceCalls
from mfuscope.cli.validate_gpu import _agent_probes
from mfuscope.cli.validate_gpu._agent_report import (
    AGENT_CHECK_NAMES,
    BreakdownProbe,
    CostProbe,
    MfuProbe,
    Shares,
    agent_checks,
)

from tests.support.simulated_gpu import SimulatedGpu

MFU = MfuProbe(36, 8.8e12, 8.8e12, 989e12, 0.7101, 0.7098)
BREAKDOWN = BreakdownProbe(
    truth=Shares(0.66, 0.11, 0.23),
    window=Shares(0.65, 0.11, 0.24),
    carried=Shares(0.66, 0.10, 0.24),
    window_steps=3,
    carried_steps=40,
    window_error=0.012,
    carried_error=0.021,
)
COST = CostProbe(
    steps=4000,
    floor_s=0.3e-6,
    device_floor_s=2.9e-6,
    step_median_s=4.1e-6,
    step_p99_s=9.0e-6,
    mark_median_s=2.6e-6,
    mark_p99_s=7.5e-6,
    calls="entering: step, __enter__, perf_counter_ns, pop, record; ...",
    unexpected="",
)


def _failing(mfu: Any = MFU, breakdown: Any = BREAKDOWN, cost: Any = COST) -> list[str]:
    return [c.name for c in agent_checks(mfu, breakdown, cost, {}) if not c.ok]


def test_healthy_figures_pass_every_check() -> None:
    checks = agent_checks(MFU, BREAKDOWN, COST, {})
    assert [c.name for c in checks] == list(AGENT_CHECK_NAMES)
    assert all(c.ok for c in checks), checks
    assert checks[0].measured.startswith("agent 0.7098 / events 0.7101 = 0.9996 over 36 steps")


@pytest.mark.parametrize(
    ("change", "failing"),
    [
        ({"mfu": dataclasses.replace(MFU, agent_mfu=0.69)}, [0]),  # 2.8% low
        ({"mfu": dataclasses.replace(MFU, agent_mfu=0.73)}, [0]),
        ({"mfu": dataclasses.replace(MFU, truth_mfu=0.0)}, [0]),
        ({"breakdown": dataclasses.replace(BREAKDOWN, window_error=0.041)}, [1]),
        ({"breakdown": dataclasses.replace(BREAKDOWN, window_steps=0, window=None)}, [1]),
        ({"breakdown": dataclasses.replace(BREAKDOWN, carried_error=0.05)}, [2]),
        ({"breakdown": dataclasses.replace(BREAKDOWN, carried_steps=0)}, [2]),
        ({"cost": dataclasses.replace(COST, step_median_s=6.0e-6)}, [3]),  # 2.07 x
        ({"cost": dataclasses.replace(COST, mark_median_s=6.0e-6)}, [3]),
        ({"cost": dataclasses.replace(COST, mark_p99_s=101e-6)}, [3]),
        ({"cost": dataclasses.replace(COST, unexpected="entering: ..., __new__, record")}, [4]),
    ],
)
def test_each_agent_check_can_fail(change: dict[str, Any], failing: list[int]) -> None:
    assert _failing(**change) == [AGENT_CHECK_NAMES[i] for i in failing]


def test_a_probe_that_did_not_run_fails_its_checks_with_its_error() -> None:
    errors = {"breakdown": "RuntimeError: NCCL error"}
    checks = agent_checks(MFU, None, None, errors)
    assert [c.ok for c in checks] == [True, False, False, False, False]
    assert checks[1].measured == checks[2].measured == "RuntimeError: NCCL error"
    assert checks[3].measured == "not run"


@pytest.mark.slow
def test_the_mfu_probe_on_a_simulated_device(tmp_path: Path) -> None:
    gpu = SimulatedGpu(gemm_s=0.001, comm_s=0.0)
    probe = _agent_probes.mfu_truth(gpu, gpu.agent_factory(), tmp_path, steps=12, chain=4, peak=1e9)
    assert probe.steps == 12 - _agent_probes.WARM_STEPS
    assert probe.counted_flops == probe.known_flops == 4 * gpu.gemm_flops()  # counted by torch
    assert probe.truth_mfu == pytest.approx(probe.known_flops / (1e9 * 0.004))
    assert probe.agent_mfu == pytest.approx(probe.truth_mfu, rel=1e-9)
    assert agent_checks(probe, BREAKDOWN, COST, {})[0].ok


@pytest.mark.slow
@pytest.mark.parametrize("misread", [False, True])
def test_the_breakdown_probe_on_a_simulated_device(tmp_path: Path, misread: bool) -> None:
    """Steps of 3 + 3 GEMMs of 1 ms, a 2 ms host sleep and a 2 ms all_reduce: 60 % compute,
    20 % communication, 20 % idle by the events. A window analysis that calls the all_reduce
    compute is 20 points off, in the window and in the steps carried from it."""
    gpu = SimulatedGpu(gemm_s=0.001, comm_s=0.002, misread_comm=misread)
    probe = _agent_probes.breakdown_truth(
        gpu, gpu.agent_factory(), tmp_path, gemms=3, gap_s=0.002, carried_steps=10, peak=1e9
    )
    assert probe.truth == Shares(pytest.approx(0.6), pytest.approx(0.2), pytest.approx(0.2))
    assert probe.window_steps == _agent_probes.WINDOW_STEPS
    assert probe.carried_steps >= 10
    checks = agent_checks(MFU, probe, COST, {})
    if misread:
        assert probe.window_error == pytest.approx(0.2)
        assert probe.carried_error == pytest.approx(0.2)
        assert [c.ok for c in checks[1:3]] == [False, False]
    else:
        assert probe.window == probe.carried == probe.truth
        assert probe.window_error == pytest.approx(0, abs=1e-9)
        assert probe.carried_error == pytest.approx(0, abs=1e-9)
        assert [c.ok for c in checks[1:3]] == [True, True]


@pytest.mark.slow
def test_the_cost_probe_lists_the_steady_boundaries_on_a_simulated_device(
    tmp_path: Path,
) -> None:
    gpu = SimulatedGpu(gemm_s=0.001, comm_s=0.0)
    probe = _agent_probes.hot_path_cost(gpu, gpu.agent_factory(), tmp_path, rounds=4, block=5)
    assert probe.unexpected == "", probe.calls
    assert probe.calls.startswith("entering: step, __enter__, perf_counter_ns, pop, raw_stream")
    assert probe.steps == 20
    assert probe.floor_s > 0 and probe.device_floor_s > 0
    assert 0 < probe.step_median_s <= probe.step_p99_s
    assert 0 < probe.mark_median_s <= probe.mark_p99_s


@pytest.mark.slow
def test_the_cost_probe_names_a_boundary_that_builds_a_stream_per_record(
    tmp_path: Path,
) -> None:
    """CUDA calls whose record goes through a Python wrapper that asks for the current stream
    each time (as `torch.cuda.Event.record()` without a stream does): not the contract."""
    gpu = SimulatedGpu(gemm_s=0.001, comm_s=0.0)

    def torch_like(calls: DeviceCalls) -> DeviceCalls:
        def record_on_the_current_stream(event: Any, stream: Any) -> None:
            calls.record(event, calls.stream())

        return dataclasses.replace(calls, record=record_on_the_current_stream)

    factory = gpu.agent_factory(torch_like)
    probe = _agent_probes.hot_path_cost(gpu, factory, tmp_path, rounds=2, block=3)
    assert "record_on_the_current_stream" in probe.unexpected
    assert not agent_checks(MFU, BREAKDOWN, probe, {})[4].ok
