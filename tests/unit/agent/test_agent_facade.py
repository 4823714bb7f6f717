"""The Agent facade in one process (no torch.distributed): reports, FLOPs, windows, robustness."""

from __future__ import annotations

import dataclasses
import functools
import logging
import math
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import torch
from mfuscope.agent import ConfigError, checkpoint_context
from mfuscope.agent._agent import Seams
from mfuscope.agent.step_timer import DeviceEventStepTimer
from mfuscope.core.errors import InputError
from mfuscope.core.schema import ReportBatch, decode_batch
from torch import nn
from torch.utils.checkpoint import checkpoint
from torch.utils.flop_counter import FlopCounterMode

from tests.support.agent_fakes import (
    Decomposition,
    Exposed,
    FakeProfiler,
    Record,
    jsonl_agent,
    step_until,
)
from tests.support.fake_cuda import FakeDevice

WIDTH = 32


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.first = nn.Sequential(nn.Linear(WIDTH, WIDTH), nn.ReLU(), nn.Linear(WIDTH, WIDTH))
        self.second = nn.Linear(WIDTH, WIDTH)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = checkpoint(self.first, x, use_reentrant=False, context_fn=checkpoint_context)
        return self.second(x)


def _train(model: nn.Module, batch: int = 4) -> None:
    model(torch.randn(batch, WIDTH)).sum().backward()


def _batches(path: Path) -> list[ReportBatch]:
    return [decode_batch(line) for line in path.read_text().splitlines()]


@pytest.mark.slow  # a child Python process (a fresh import)
def test_importing_the_package_does_not_import_torch() -> None:
    code = (
        "import sys, mfuscope.agent, mfuscope.core.trace, mfuscope.agent.config\n"
        "assert 'torch' not in sys.modules, 'torch imported'\n"
        "mfuscope.agent.checkpoint_context\n"
        "assert 'torch' not in sys.modules\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


def test_every_step_reported_once_with_counted_flops(tmp_path: Path) -> None:
    model = Net()
    with FlopCounterMode(display=False) as counter:
        _train(model)
    agent = jsonl_agent(tmp_path, model)
    for _ in range(5):
        with agent.step():
            _train(model)
    agent.close()
    batches = _batches(tmp_path / "out.jsonl")
    reports = [r for b in batches for r in b.reports]
    assert [r.step for r in reports] == list(range(5))
    # the plain count includes the recomputation; the agent keeps it apart
    assert all(r.model_flops + r.recompute_flops == counter.get_total_flops() for r in reports)
    # the first linear (2 * batch * WIDTH^2) is recomputed in backward
    assert all(r.recompute_flops == 2 * 4 * WIDTH * WIDTH for r in reports)
    assert all(r.wall_s > 0 and r.components == () for r in reports)
    first = batches[0]
    assert (first.job, first.rank, first.world_size, first.device) == ("unit", 0, 1, "cpu")
    assert (first.peak_flops, first.peak_source) == (1e11, "user")


def test_given_flops_and_disabled_agent(tmp_path: Path) -> None:
    agent = jsonl_agent(tmp_path, flops_per_step=3e9, recompute_flops_per_step=1e9)
    with agent.step():
        pass
    agent.close()
    report = _batches(tmp_path / "out.jsonl")[0].reports[0]
    assert (report.model_flops, report.recompute_flops) == (3e9, 1e9)

    disabled = jsonl_agent(tmp_path, jsonl_path=str(tmp_path / "off.jsonl"), enabled=False)
    with disabled.step():
        pass
    disabled.close()
    assert not (tmp_path / "off.jsonl").exists()


def test_flops_given_to_a_step_take_precedence(tmp_path: Path) -> None:
    # Per-step FLOPs beat both counting and flops_per_step, for that step only.
    model = Net()
    counted = jsonl_agent(tmp_path, model)
    plain = jsonl_agent(tmp_path, jsonl_path=str(tmp_path / "given.jsonl"), flops_per_step=3e9)
    for agent in (counted, plain):
        with agent.step(flops=7e9, recompute_flops=2e9):
            _train(model)
        with agent.step(flops=5e9):
            _train(model)
        with agent.step():
            _train(model)
        agent.close()
    counted_reports = [r for b in _batches(tmp_path / "out.jsonl") for r in b.reports]
    given_reports = [r for b in _batches(tmp_path / "given.jsonl") for r in b.reports]
    step_flops = [(r.model_flops, r.recompute_flops) for r in counted_reports]
    recompute = 2 * 4 * WIDTH * WIDTH  # the checkpointed first linear, recomputed in backward
    # 3 linears forward, their 3 weight gradients, 2 input gradients (the input needs none)
    forward_backward = 8 * 2 * 4 * WIDTH * WIDTH
    assert step_flops == [(7e9, 2e9), (5e9, 0.0), (forward_backward, recompute)]
    assert [(r.model_flops, r.recompute_flops) for r in given_reports] == [
        (7e9, 2e9),
        (5e9, 0.0),
        (3e9, 0.0),
    ]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"flops": float("nan")}, r"agent\.step\(flops=\.\.\.\) must be a finite number >= 0"),
        ({"flops": -1.0}, "got -1.0"),
        ({"flops": float("inf")}, "got inf"),
        ({"flops": True}, "got True"),
        ({"flops": "1e9"}, "got '1e9'"),
        ({"flops": 1e9, "recompute_flops": -2}, r"recompute_flops=\.\.\.\) must be"),
        ({"recompute_flops": 1e9}, "needs flops"),
    ],
)
def test_bad_step_flops_raise_a_clear_error(
    tmp_path: Path, kwargs: dict[str, Any], message: str
) -> None:
    for agent in (jsonl_agent(tmp_path), jsonl_agent(tmp_path, enabled=False)):
        with pytest.raises(InputError, match=message):
            agent.step(**kwargs)
        with agent.step(flops=0):  # the agent is still usable
            pass
        agent.close()


def test_bad_options_raise_at_construction(tmp_path: Path) -> None:
    with pytest.raises(ConfigError):
        jsonl_agent(tmp_path, profile_steps=0)
    with pytest.raises(ConfigError):
        jsonl_agent(tmp_path, no_such_option=True)


def test_user_exceptions_propagate_and_the_agent_carries_on(tmp_path: Path) -> None:
    model = Net()
    agent = jsonl_agent(tmp_path, model)
    with pytest.raises(ZeroDivisionError), agent.step():
        _ = 1 / 0
    with agent.step(), agent.step():  # a nested step is ignored, not an error
        _train(model)
    agent.close()
    agent.close()  # idempotent
    steps = [r.step for b in _batches(tmp_path / "out.jsonl") for r in b.reports]
    assert steps == [0, 1]
    assert agent.health.internal_errors == 0


def test_internal_errors_are_counted_and_logged_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    def exploding(event: Any, stream: Any) -> None:
        raise RuntimeError("timer bug")

    calls = dataclasses.replace(FakeDevice().calls(), record=exploding)
    agent = jsonl_agent(tmp_path, seams=Seams(timer=DeviceEventStepTimer(calls, close_wait_s=0)))
    with caplog.at_level(logging.WARNING, logger="mfuscope.agent"):
        for _ in range(5):
            with agent.step():
                pass
    agent.close()
    assert agent.health.internal_errors == 10
    assert len([r for r in caplog.records if "timer bug" in r.getMessage()]) == 1


# A profiled step of 1 s: 50% compute, 10% recompute, 20% exposed dp communication, 20% idle.
_window_step = functools.partial(
    Decomposition,
    wall_s=1.0,
    compute_s=0.5,
    recompute_s=0.1,
    exposed_comm_s=0.2,
    bubble_idle_s=0.2,
    overlapped_comm_s=0.3,
    exposed_comm=(Exposed("dp", "intra_node", 0.2),),
    collectives=(Record("all_reduce", "dp", "intra_node", 2, 4096, 0.5, 0.6),),
)


def test_window_breakdown_attaches_to_later_steps(tmp_path: Path) -> None:
    def analyse(path: str) -> Sequence[Any]:
        return [_window_step(2), _window_step(3, compute_s=0.7, bubble_idle_s=0.0)]

    agent = jsonl_agent(
        tmp_path,
        flops_per_step=1e9,
        profile=True,
        profile_first_step=2,
        profile_steps=2,
        # the thread clock not read: steps carry the window's shares (how GPU timelines carry
        # them; test_report_assembly has CPU steps carrying their own blocked time)
        seams=Seams(
            profiler_factory=FakeProfiler,
            analyse=analyse,
            timer=None,
            thread_clock=lambda: None,
        ),
    )
    for _ in range(4):
        with agent.step():
            pass
    last = 4 + step_until(agent, lambda health: health.windows_analysed_total > 0)
    for _ in range(4):
        with agent.step():
            pass
    agent.close()
    reports = {r.step: r for b in _batches(tmp_path / "out.jsonl") for r in b.reports}
    assert sorted(reports) == list(range(last + 4))
    assert reports[0].components == () and reports[1].breakdown_step is None
    for step in (2, 3):  # the profiled steps carry their own decomposition and collectives
        assert reports[step].breakdown_step == step
        assert [(c.op, c.count, c.bytes) for c in reports[step].collectives] == [
            ("all_reduce", 1, 4096)
        ]
    own = {c.component: c.seconds / reports[3].wall_s for c in reports[3].components}
    assert own["compute"] == pytest.approx(0.7)
    # later steps: the window's steps after the first (whose collectives wait on the ranks'
    # profiler start), no collectives
    for step in range(last, last + 4):
        report = reports[step]
        assert report.breakdown_step == 3 and report.collectives == ()
        assert math.isclose(math.fsum(c.seconds for c in report.components), report.wall_s)
        share = {c.component: c.seconds / report.wall_s for c in report.components}
        assert share["compute"] == pytest.approx(0.7)
        assert report.overlapped_comm_s == pytest.approx(0.3 * report.wall_s)
    assert agent.health.snapshot().windows_analysed_total == 1


@pytest.mark.slow  # the window is analysed in a child process
def test_real_profiler_window_on_one_process(tmp_path: Path) -> None:
    """The real torch.profiler and the real engine, without torch.distributed."""
    model = Net()
    agent = jsonl_agent(tmp_path, model, profile=True, profile_first_step=1, profile_steps=2)
    for _ in range(3):
        with agent.step():
            _train(model, batch=64)
    last = 3 + step_until(agent, lambda health: health.windows_analysed_total > 0)
    with agent.step():
        _train(model, batch=64)
    agent.close()
    reports = {r.step: r for b in _batches(tmp_path / "out.jsonl") for r in b.reports}
    assert sorted(reports) == list(range(last + 1))
    assert agent.health.snapshot().windows_analysed_total == 1, agent.health.snapshot()
    for step in (1, 2):
        kinds = {c.component for c in reports[step].components}
        assert {"compute", "recompute"} <= kinds
        assert reports[step].breakdown_step == step
    assert reports[last].breakdown_step == 2
    assert not list(tmp_path.glob("mfuscope-window-*"))


def test_first_step_numbers_a_resumed_job_and_each_agent_is_its_own_incarnation(
    tmp_path: Path,
) -> None:
    paths = [tmp_path / "first.jsonl", tmp_path / "resumed.jsonl"]
    for path, first_step in zip(paths, (0, 40), strict=True):
        agent = jsonl_agent(
            tmp_path, jsonl_path=str(path), first_step=first_step, max_batch_reports=2
        )
        for _ in range(5):
            with agent.step():
                pass
        agent.close()
    first, resumed = (_batches(path) for path in paths)
    assert [r.step for b in resumed for r in b.reports] == list(range(40, 45))
    assert len(resumed) >= 2  # several batches, one incarnation
    assert len({b.incarnation for b in first}) == len({b.incarnation for b in resumed}) == 1
    assert first[0].incarnation and resumed[0].incarnation
    assert first[0].incarnation != resumed[0].incarnation


@pytest.mark.slow  # the window is analysed in a child process
def test_real_profiler_window_trace_is_kept_and_analysable(tmp_path: Path) -> None:
    from mfuscope.core.trace import analyze_trace, read_trace

    model = Net()
    kept = tmp_path / "kept"
    agent = jsonl_agent(
        tmp_path,
        model,
        profile=True,
        profile_first_step=1,
        profile_steps=2,
        keep_traces=3,
        keep_traces_dir=str(kept),
    )
    for _ in range(3):
        with agent.step():
            _train(model, batch=64)
    step_until(agent, lambda health: health.windows_analysed_total > 0)
    agent.close()
    (trace,) = kept.iterdir()
    assert trace.name.startswith("mfuscope-rank0-step1-2-") and trace.name.endswith(".json.gz")
    steps = analyze_trace(read_trace(trace)).steps  # the window behind the reported numbers
    assert [s.step for s in steps] == [1, 2]
