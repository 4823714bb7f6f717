"""`agent.mark_step()`: one call at the top of each iteration begins a step and ends the one
before; `close()` ends the last. Periods, FLOPs (counted over every micro-batch of a step, or
given), mixed use with `with agent.step():`, exceptions, profiled windows, a disabled agent."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest
import torch
from mfuscope.agent import Agent
from mfuscope.agent._agent import Seams
from mfuscope.core.errors import InputError
from mfuscope.core.schema import decode_batch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from tests.support.agent_fakes import FakeProfiler, jsonl_agent
from tests.support.step_records import FakeClock, reporter_for

WIDTH = 16


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(WIDTH, WIDTH), nn.ReLU(), nn.Linear(WIDTH, WIDTH))


def _reports(path: Path) -> dict[int, Any]:
    lines = path.read_text().splitlines()
    return {r.step: r for line in lines for r in decode_batch(line).reports}


def test_marked_steps_run_from_one_mark_to_the_next_and_close_ends_the_last(
    clock: FakeClock,
) -> None:
    recorder, reporter, timed = reporter_for(clock)
    clock.advance(5.0)  # before the first mark: no step
    for seconds in (1.0, 2.0, 0.5):
        recorder.mark()
        clock.advance(seconds)
    reporter.drain()
    assert [(t.step, t.wall_s) for t in timed] == [(0, 1.0), (1, 2.0)]  # step 2 still open
    clock.advance(0.25)  # until close: the last step's
    recorder.close()
    clock.advance(9.0)
    reporter.drain(final=True)
    assert [(t.step, t.wall_s) for t in timed] == [(0, 1.0), (1, 2.0), (2, 0.75)]
    recorder.mark()  # after close: nothing
    reporter.drain(final=True)
    assert len(timed) == 3 and recorder.begun == 3


def test_mixed_marks_and_with_blocks_make_consecutive_steps(
    clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    """A `with` block ends the marked step before it (at the block's start) and is a step of its
    own until the next boundary; a mark inside a `with` block is ignored and logged."""
    recorder, reporter, timed = reporter_for(clock)
    recorder.mark()
    clock.advance(1.0)
    recorder.mark()
    clock.advance(2.0)
    with recorder:  # ends step 1 at 3 s
        clock.advance(0.5)
        with caplog.at_level(logging.WARNING, logger="mfuscope.agent"):
            recorder.mark()  # ignored: the with-step goes on
        clock.advance(0.5)
    clock.advance(1.0)  # between steps: the with-step's, as bubble
    recorder.mark()
    clock.advance(0.25)
    with recorder:
        clock.advance(0.125)
    recorder.close()  # the with-step ended at its exit: nothing more to end
    clock.advance(5.0)
    reporter.drain(final=True)
    assert [(t.step, t.wall_s) for t in timed] == [
        (0, 1.0),
        (1, 2.0),
        (2, 2.0),
        (3, 0.25),
        (4, 0.125),
    ]
    assert "agent.mark_step() inside `with agent.step()`; ignored" in caplog.text


def test_gradient_accumulation_one_marked_step_per_optimizer_step(tmp_path: Path) -> None:
    """Two micro-batches per optimizer step: each step's counted FLOPs are both micro-batches'
    (the first step is counted, the next carry its count), one report per optimizer step."""
    model = _model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    agent = jsonl_agent(tmp_path, model)
    micro = [torch.randn(4, WIDTH) for _ in range(2)]
    for _ in range(5):
        agent.mark_step()
        for batch in micro:
            model(batch).sum().backward()
        optimizer.step()
        optimizer.zero_grad()
    agent.close()
    reports = _reports(tmp_path / "out.jsonl")
    assert sorted(reports) == list(range(5))
    with FlopCounterMode(display=False) as counter:  # one micro-batch, as torch counts it
        model(micro[0]).sum().backward()
    assert {reports[s].model_flops for s in range(5)} == {2 * counter.get_total_flops()}


def test_marked_steps_are_counted_like_with_steps(tmp_path: Path) -> None:
    model = _model()
    counts: dict[str, list[float]] = {}
    for mode in ("with", "mark"):
        (tmp_path / mode).mkdir()
        agent = jsonl_agent(tmp_path / mode, model)
        for batch in (4, 4, 8, 8):  # a shape change is counted on its own
            if mode == "with":
                with agent.step():
                    model(torch.randn(batch, WIDTH)).sum().backward()
            else:
                agent.mark_step()
                model(torch.randn(batch, WIDTH)).sum().backward()
        agent.close()
        reports = _reports(tmp_path / mode / "out.jsonl")
        counts[mode] = [reports[s].model_flops for s in range(4)]
    assert counts["mark"] == counts["with"]
    assert counts["mark"][2] == 2 * counts["mark"][0] > 0


def test_mark_step_given_flops_applies_to_the_step_it_begins(tmp_path: Path) -> None:
    agent = jsonl_agent(tmp_path, flops_per_step=1e9)
    agent.mark_step()
    agent.mark_step(flops=5.0, recompute_flops=1.0)
    agent.mark_step()
    agent.mark_step(2.0)
    with pytest.raises(InputError, match=r"agent\.mark_step\(flops=\.\.\.\) must be a finite"):
        agent.mark_step(flops=-1.0)
    with pytest.raises(InputError, match=r"agent\.mark_step\(recompute_flops=\.\.\.\) needs"):
        agent.mark_step(recompute_flops=1.0)
    agent.close()
    reports = _reports(tmp_path / "out.jsonl")
    assert [(reports[s].model_flops, reports[s].recompute_flops) for s in range(4)] == [
        (1e9, 0.0),
        (5.0, 1.0),
        (1e9, 0.0),
        (2.0, 0.0),  # the last, ended by close
    ]


def test_an_exception_that_leaves_the_agent_fails_the_open_marked_step(tmp_path: Path) -> None:
    """`with Agent(...) as agent:` closes on the way out; the marked step open then ends there
    as failed (its FLOP count is not kept), and the exception goes on to the caller."""
    model = _model()
    with pytest.raises(ZeroDivisionError), jsonl_agent(tmp_path, model) as agent:
        agent.mark_step()  # the first step: counted
        model(torch.randn(4, WIDTH)).sum().backward()
        _ = 1 / 0
    reports = _reports(tmp_path / "out.jsonl")
    assert sorted(reports) == [0] and reports[0].model_flops == 0.0  # unknown: not counted


def test_an_exception_caught_in_the_loop_leaves_the_marked_step_open(tmp_path: Path) -> None:
    model = _model()
    agent = jsonl_agent(tmp_path, model)
    for index in range(4):
        agent.mark_step()
        try:
            if index == 1:
                raise ValueError("a bad batch, skipped")
            model(torch.randn(4, WIDTH)).sum().backward()
        except ValueError:
            continue
    agent.close()
    reports = _reports(tmp_path / "out.jsonl")
    assert sorted(reports) == list(range(4))
    assert reports[0].model_flops == reports[2].model_flops == reports[3].model_flops > 0


def test_marked_steps_take_a_profiled_window(tmp_path: Path) -> None:
    log: list[str] = []
    analysed: list[str] = []
    agent = jsonl_agent(
        tmp_path,
        flops_per_step=1e9,
        profile=True,
        profile_first_step=3,
        profile_steps=2,
        profile_every_steps=1000,
        seams=Seams(
            profiler_factory=lambda: FakeProfiler(log),
            analyse=lambda path: analysed.append(path) or [],
        ),
    )
    for _ in range(10):
        agent.mark_step()
    agent.close()
    assert log[:3] == ["start", "stop", "export"] and len(analysed) == 1
    assert sorted(_reports(tmp_path / "out.jsonl")) == list(range(10))


def test_a_disabled_agent_marks_nothing(tmp_path: Path) -> None:
    agent = Agent(job="unit", jsonl_path=str(tmp_path / "out.jsonl"), enabled=False)
    agent.mark_step()
    agent.mark_step(flops=1.0)
    agent.close()
    assert not (tmp_path / "out.jsonl").exists()
