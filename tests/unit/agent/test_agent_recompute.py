"""checkpoint_context: the recompute range, separate recompute FLOPs, and the checkpoint patch."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import pytest
import torch
import torch.utils.checkpoint as checkpoint_module
from mfuscope.agent._counted_flops import StepFlopCount
from mfuscope.agent._recompute import (
    RECOMPUTE_RANGE,
    checkpoint_context,
    set_recompute_counter,
    wrap_checkpoint,
)
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

WIDTH, BATCH = 64, 8


def _block() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(WIDTH, WIDTH), nn.ReLU(), nn.Linear(WIDTH, WIDTH))


def _step(block: nn.Module, checkpointed: bool, context_fn: object = None) -> None:
    x = torch.randn(BATCH, WIDTH, requires_grad=True)
    if checkpointed:
        y = checkpoint_module.checkpoint(
            block, x, use_reentrant=False, context_fn=context_fn or checkpoint_context
        )
    else:
        y = block(x)
    y.sum().backward()


def test_recompute_range_appears_only_while_profiling() -> None:
    block = _block()
    _step(block, checkpointed=True)  # no profiler: nothing to annotate, nothing breaks
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        _step(block, checkpointed=True)
    names = [event.name for event in prof.events()]
    assert names.count(RECOMPUTE_RANGE) == 1
    # the recomputed linear ran inside the range: its forward mm appears twice in the step
    assert sum(1 for n in names if n == "aten::addmm") >= 3


def test_counted_step_separates_recompute_flops() -> None:
    block = _block()
    with FlopCounterMode(display=False) as plain:
        _step(block, checkpointed=False)
    session = StepFlopCount()
    set_recompute_counter(session.recompute_context)
    try:
        with session:
            _step(block, checkpointed=True)
    finally:
        set_recompute_counter(None)
    model, recompute = session.result.model_flops, session.result.recompute_flops
    # Recomputation stops early once every saved tensor is rebuilt: the first linear is redone
    # (2 * batch * in * out FLOPs), the last one is not needed again.
    assert recompute == 2 * BATCH * WIDTH * WIDTH
    assert model == plain.get_total_flops()


@contextlib.contextmanager
def _recording(log: list[str], name: str) -> Iterator[None]:
    log.append(f"enter {name}")
    try:
        yield  # early-stopping recomputation leaves by an exception thrown in here
    finally:
        log.append(f"exit {name}")


def test_wrap_checkpoint_patches_composes_and_restores() -> None:
    original = checkpoint_module.checkpoint
    log: list[str] = []
    set_recompute_counter(lambda: _recording(log, "counter"))
    unwrap = wrap_checkpoint()
    try:
        assert checkpoint_module.checkpoint is not original
        assert wrap_checkpoint()() is None  # a second wrap is a no-op
        block = _block()
        x = torch.randn(BATCH, WIDTH, requires_grad=True)
        checkpoint_module.checkpoint(block, x, use_reentrant=False).sum().backward()
        assert log == ["enter counter", "exit counter"]
        log.clear()

        def user_context_fn() -> tuple[object, object]:
            return contextlib.nullcontext(), _recording(log, "user")

        checkpoint_module.checkpoint(
            block, x, use_reentrant=False, context_fn=user_context_fn
        ).sum().backward()
        assert log == ["enter counter", "enter user", "exit user", "exit counter"]
        log.clear()
        checkpoint_module.checkpoint(block, x, use_reentrant=True).sum().backward()
        assert log == []  # reentrant checkpointing cannot take a context_fn
    finally:
        unwrap()
        set_recompute_counter(None)
    assert checkpoint_module.checkpoint is original


def test_recompute_context_propagates_user_errors() -> None:
    forward, recompute = checkpoint_context()
    with pytest.raises(KeyError), forward, recompute:
        raise KeyError("boom")
