"""FLOPs counted with torch's FlopCounterMode over real CPU training steps, recompute apart."""

from __future__ import annotations

import threading

import pytest
import torch
import torch.nn.functional as F
from mfuscope.agent._counted_flops import (
    RecomputeCounter,
    StepFlopCount,
    StepFlops,
    count_step_flops,
    cpu_attention_flop_mapping,
    recompute_context_fn,
)
from mfuscope.core.flops import TransformerShape, transformer_flops_per_token
from torch import nn
from torch.utils.checkpoint import checkpoint, set_checkpoint_early_stop
from torch.utils.flop_counter import FlopCounterMode

B, T, H, HEADS, V, LAYERS = 2, 32, 64, 4, 96, 2


class Block(nn.Module):
    """Pre-norm decoder block: q/k/v/o projections, CPU SDPA, a 4h MLP; no biases."""

    def __init__(self) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(H)
        self.qkv = nn.Linear(H, 3 * H, bias=False)
        self.out = nn.Linear(H, H, bias=False)
        self.norm2 = nn.LayerNorm(H)
        self.up = nn.Linear(H, 4 * H, bias=False)
        self.down = nn.Linear(4 * H, H, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv(self.norm1(x)).split(H, dim=-1)
        q, k, v = (t.view(B, T, HEADS, H // HEADS).transpose(1, 2) for t in (q, k, v))
        attn = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.out(attn.transpose(1, 2).reshape(B, T, H))
        return x + self.down(F.gelu(self.up(self.norm2(x))))


class TinyGPT(nn.Module):
    def __init__(self, checkpointed: bool = False, counter: RecomputeCounter | None = None):
        super().__init__()
        self.embed = nn.Embedding(V, H)
        self.blocks = nn.ModuleList(Block() for _ in range(LAYERS))
        self.head = nn.Linear(H, V, bias=False)
        self.checkpointed = checkpointed
        self.context_fn = recompute_context_fn(counter or RecomputeCounter())

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens)
        for block in self.blocks:
            if self.checkpointed:
                x = checkpoint(block, x, use_reentrant=False, context_fn=self.context_fn)
            else:
                x = block(x)
        return self.head(x)


def _train_step(model: TinyGPT) -> None:
    torch.manual_seed(0)
    tokens = torch.randint(0, V, (B, T))
    logits = model(tokens)
    loss = F.cross_entropy(logits.reshape(-1, V), tokens.reshape(-1))
    loss.backward()
    with torch.no_grad():  # plain SGD (torch.optim costs a second of imports; no FLOPs counted)
        for p in model.parameters():
            if p.grad is not None:
                p -= 0.1 * p.grad


SHAPE = TransformerShape(layers=LAYERS, hidden=H, heads=HEADS, vocab=V)
# The SDPA backward recomputes the score matrix internally (2 * b * H * T^2 * Q per call):
# hardware work, counted in recompute_flops, not model work. Per layer: 2 * B * T^2 * H.
FLASH_BACKWARD_SCORES = LAYERS * 2 * B * T * T * H


@pytest.fixture(scope="module")
def plain() -> StepFlops:
    """One counted step without checkpointing (counted once: each step costs ~0.1-1 s here)."""
    return count_step_flops(lambda: _train_step(TinyGPT()))


def test_counted_step_matches_the_analytical_count(plain: StepFlops) -> None:
    step = plain
    analytical = transformer_flops_per_token(SHAPE, seq_len=T, convention="megatron").model
    assert step.model_flops == analytical * B * T
    assert step.recompute_flops == FLASH_BACKWARD_SCORES


def test_cpu_attention_is_registered() -> None:
    # Without the mapping FlopCounterMode misses the CPU SDPA forward and backward entirely.
    def step() -> None:
        _train_step(TinyGPT())

    with FlopCounterMode(display=False) as plain:
        step()
    with FlopCounterMode(display=False, custom_mapping=cpu_attention_flop_mapping()) as ours:
        step()
    attention_fwd = LAYERS * 4 * B * T * T * H
    attention_bwd = LAYERS * 10 * B * T * T * H  # 5 bmm in torch's sdpa backward formula
    assert ours.get_total_flops() - plain.get_total_flops() == attention_fwd + attention_bwd


def test_recompute_is_counted_apart_and_excluded_from_model_flops(plain: StepFlops) -> None:
    counter = RecomputeCounter()
    with set_checkpoint_early_stop(False):  # recompute each whole block (torch stops early else)
        step = count_step_flops(lambda: _train_step(TinyGPT(checkpointed=True, counter=counter)))
    assert step.model_flops == plain.model_flops
    # one forward of every block, exactly what the analytical "full" mode adds, and the score
    # recompute of the attention backward kernels
    full = transformer_flops_per_token(SHAPE, seq_len=T, recompute="full", convention="megatron")
    assert step.recompute_flops == full.recompute * B * T + FLASH_BACKWARD_SCORES
    assert counter.total_flops == full.recompute * B * T
    assert step.hardware_flops == plain.model_flops + step.recompute_flops


def test_early_stopping_recompute_is_still_apart(plain: StepFlops) -> None:
    # torch's default non-reentrant checkpoint stops recomputing once the saved tensors are back,
    # so it recomputes less than a full forward; the split must still be exact.
    step = count_step_flops(lambda: _train_step(TinyGPT(checkpointed=True)))
    assert step.model_flops == plain.model_flops
    forward = transformer_flops_per_token(SHAPE, seq_len=T, recompute="full", convention="megatron")
    assert 0 < step.recompute_flops - FLASH_BACKWARD_SCORES <= forward.recompute * B * T


def test_counter_keeps_counting_between_steps() -> None:
    counter = RecomputeCounter()
    model = TinyGPT(checkpointed=True, counter=counter)
    _train_step(model)  # outside count_step_flops
    first = counter.total_flops
    assert first > 0
    step = count_step_flops(lambda: _train_step(model))
    assert counter.total_flops == first + step.recompute_flops - FLASH_BACKWARD_SCORES


def test_count_step_flops_is_not_reentrant() -> None:
    with pytest.raises(RuntimeError, match="reentrant"):
        count_step_flops(lambda: count_step_flops(lambda: None))
    # and the registry is released after the failure
    assert count_step_flops(lambda: None).model_flops == 0


def test_recompute_on_another_thread_is_attributed_to_the_step() -> None:
    # On GPU the backward (and the recomputation) runs on autograd's device threads; the
    # registry is process-wide so the step still sees it.
    counter = RecomputeCounter()
    x = torch.randn(8, 16)
    w = torch.randn(16, 16, requires_grad=True)

    def step() -> None:
        def recompute_elsewhere() -> None:
            with counter.context():
                _ = x @ w  # 2 * 8 * 16 * 16 FLOPs

        worker = threading.Thread(target=recompute_elsewhere)
        worker.start()
        worker.join()

    result = count_step_flops(step)
    assert result.recompute_flops == 2 * 8 * 16 * 16
    assert counter.total_flops == 2 * 8 * 16 * 16
    # A plain thread does not inherit the step counter's dispatch mode, so its FLOPs were never
    # in the step total and nothing is subtracted (model FLOPs never go negative).
    assert result.model_flops == 0


def test_begin_end_form_matches_the_function_form(plain: StepFlops) -> None:
    model = TinyGPT(checkpointed=True)
    with StepFlopCount() as count:
        with pytest.raises(RuntimeError, match="not been counted"):
            _ = count.result
        _train_step(model)
    assert count.result.model_flops == plain.model_flops
    assert count.result.recompute_flops > FLASH_BACKWARD_SCORES


def test_context_fn_counts_only_what_runs_in_its_recompute_context() -> None:
    # checkpoint enters the first context around the original forward and the second around the
    # recomputation: only the second's FLOPs are recompute FLOPs, and each use gets a fresh pair.
    counter = RecomputeCounter()
    context_fn = recompute_context_fn(counter)
    a, b = torch.randn(8, 16), torch.randn(16, 4)
    forward_ctx, recompute_ctx = context_fn()
    with forward_ctx:
        torch.mm(a, b)
    assert counter.total_flops == 0
    with recompute_ctx:
        torch.mm(a, b)
    assert counter.total_flops == 2 * 8 * 16 * 4
    _, second_recompute = context_fn()
    assert second_recompute is not recompute_ctx
    with second_recompute:
        torch.mm(a, b)
    assert counter.total_flops == 2 * (2 * 8 * 16 * 4)


def test_fake_tensor_ops_run_but_are_not_counted() -> None:
    # DTensor's sharding propagation runs an op on fake tensors of the global shape the first
    # time it meets it; that computes nothing and must not count (the real mm here does).
    from torch._subclasses.fake_tensor import FakeTensorMode

    a, b = torch.randn(8, 16), torch.randn(16, 4)

    def step() -> None:
        _ = a @ b
        with FakeTensorMode() as fake:
            shape = (fake.from_tensor(a) @ fake.from_tensor(b)).shape
        assert shape == (8, 4)

    assert count_step_flops(step).model_flops == 2 * 8 * 16 * 4


def test_paused_work_is_not_counted() -> None:
    from mfuscope.agent import _uncounted as uncounted

    a = torch.randn(8, 16)

    def step() -> None:
        _ = a @ a.T  # 2 * 8 * 16 * 8
        with uncounted.pause():
            assert uncounted.paused()
            _ = a.T @ a
        assert not uncounted.paused()

    assert count_step_flops(step).model_flops == 2 * 8 * 16 * 8
