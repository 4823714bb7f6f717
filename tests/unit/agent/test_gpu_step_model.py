"""Carried GPU steps against a discrete-event model that knows its own truth
(tests/support/gpu_step_model.py), through the agent's own report path
(tests/support/gpu_step_agent.py). Model time only: no processes, no sleeps."""

from __future__ import annotations

import json
import math
from functools import cache
from pathlib import Path

import pytest
from mfuscope.agent._runtime import _Device, _engine_analyse
from mfuscope.core.flight_records import entry_from_dump

from tests.support.gpu_step_agent import (
    AgentRun,
    carried_errors,
    model_topology,
    run_rank,
    window_steps,
)
from tests.support.gpu_step_model import (
    CASES,
    ModelCase,
    ModelRank,
    StepShape,
    flight_entries,
    simulate,
    window_trace,
)

STEPS = 300
POINTS = 4.0  # the target: within 4 points of the model's truth, per rank and case
BY_NAME = {case.name: case for case in CASES}


@cache
def _model(name: str) -> list[ModelRank]:
    return simulate(BY_NAME[name], STEPS)


def test_the_engine_reads_the_models_trace_as_the_model_knows_it(tmp_path: Path) -> None:
    ranks = _model("rank 1 5 ms late every step")
    device = _Device("NVIDIA H100 80GB HBM3", True, None)
    analyse = _engine_analyse(model_topology(0), device, lambda path: None, None)
    for rank in ranks:
        path = tmp_path / f"rank{rank.rank}.json"
        path.write_text(json.dumps(window_trace(rank, [20, 21, 22], StepShape())))
        steps = {s.step: s for s in analyse(str(path))}
        assert sorted(steps) == [20, 21, 22]
        for number in (20, 21):  # the last one ends at its last kernel, not the next step
            truth, seen = rank.steps[number].truth, steps[number]
            assert truth is not None
            assert seen.wall_s == pytest.approx(truth.wall_s, rel=1e-6)
            assert seen.compute_s == pytest.approx(truth.compute_s, rel=1e-6)
            assert seen.exposed_comm_s == pytest.approx(truth.exposed_comm_s, abs=1e-7)
            assert seen.bubble_idle_s == pytest.approx(truth.idle_s, abs=1e-7)
            assert {c.op for c in seen.collectives} == {"all_reduce"}


def test_the_model_keeps_its_books() -> None:
    for case in CASES:
        for rank in _model(case.name):
            for step in rank.steps:
                truth = step.truth
                assert truth is not None and truth.idle_s >= -1e-9
                parts = truth.compute_s + truth.exposed_comm_s + truth.idle_s
                assert math.isclose(parts, truth.wall_s, rel_tol=1e-9)
    # A peer 5 ms late: the other rank's all_reduces span the wait.
    early, late = _model("rank 1 5 ms late every step")
    assert sum(d for _, d, _ in early.steps[50].comms) > sum(d for _, d, _ in late.steps[50].comms)
    entries = [entry_from_dump(op.entry) for op in flight_entries(early, StepShape())]
    assert len(entries) == STEPS * StepShape().buckets
    first = entries[0]
    assert first is not None and first.op == "all_reduce" and first.backend == "nccl"
    assert first.duration_s == pytest.approx(early.steps[0].comms[0][1] / 1e6 + 4e-6)
    assert first.size_bytes == StepShape().bucket_elems * 4


@cache
def _run(name: str, rank: int, timed: bool = True) -> AgentRun:
    return run_rank(_model(name)[rank], BY_NAME[name].shape, timed=timed)


@pytest.mark.parametrize("case", CASES, ids=lambda case: case.name)
def test_carried_exposed_comm_follows_each_step(case: ModelCase) -> None:
    for model in _model(case.name):
        run = _run(case.name, model.rank)
        assert run.durations_seen
        error = carried_errors(run, model)
        assert error.steps >= 250  # every step between windows, after the first window
        assert abs(error.by_time) <= POINTS, (model.rank, error)
        assert abs(error.worst) <= POINTS, (model.rank, error)
        idle = carried_errors(run, model, "bubble_idle")
        assert abs(idle.worst) <= POINTS, (model.rank, idle)


def test_a_data_stall_lands_in_bubble_idle() -> None:
    name = "data stall 20 ms every 10th step, all ranks"
    model = _model(name)[0]
    run = _run(name, 0)
    profiled = set(window_steps(STEPS))
    # The loader's 20 ms before step 10k is idle time of the step before it on the device.
    stalled = [k - 1 for k in range(20, STEPS, 10) if k - 1 not in profiled]
    stalled = [k for k in stalled if run.reports[k].breakdown_step is not None]
    assert len(stalled) >= 20
    for step in stalled:
        truth = model.steps[step].truth
        assert truth is not None and truth.idle_s > 0.02
        idle = sum(c.seconds for c in run.reports[step].components if c.component == "bubble_idle")
        assert idle == pytest.approx(truth.idle_s, abs=0.04 * truth.wall_s)


def test_without_durations_steps_carry_the_windows_shares() -> None:
    name = "comm grows past the compute hiding it"
    model = _model(name)[1]
    run = _run(name, 1, timed=False)
    assert not run.durations_seen
    profiled = window_steps(STEPS)
    shares: dict[int, set[float]] = {}
    for step, report in run.reports.items():
        if report.breakdown_step is None or step in profiled:
            continue
        exposed = sum(c.seconds for c in report.components if c.component == "exposed_comm")
        shares.setdefault(report.breakdown_step, set()).add(round(exposed / report.wall_s, 9))
    # Between two windows every step carries one share, the window's.
    assert len(shares) == 5 and all(len(found) == 1 for found in shares.values())
    # Which misses the growth: the last steps before each window are the furthest off.
    assert carried_errors(run, model).worst < -POINTS
