"""Attention's backward recomputation is hardware work: counted model FLOPs of a GPT with SDPA
attention equal the analytical 6N + 12*L*H*Q*T per token, and HFU exceeds MFU by exactly the
score matrix the SDPA backward kernels recompute (2*b*H*Tq*Tk*Q per call)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from mfuscope.agent._counted_flops import (
    RecomputeCounter,
    StepFlopCount,
    attention_backward_recompute,
    count_step_flops,
)
from mfuscope.core.flops import TransformerShape, transformer_flops_per_token
from mfuscope.core.mfu import hfu, mfu
from mfuscope.core.schema import decode_batch
from torch import nn
from torch.utils.flop_counter import flop_registry, sdpa_backward_flop_count

from tests.support.agent_fakes import jsonl_agent

BATCH, SEQ, WIDTH, HEADS, VOCAB, LAYERS = 2, 32, 64, 4, 96, 2
HEAD_DIM = WIDTH // HEADS


class Block(nn.Module):
    """A GPT-2 block from torch modules: biases, LayerNorms, GELU MLP, causal SDPA."""

    def __init__(self) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(WIDTH)
        self.qkv = nn.Linear(WIDTH, 3 * WIDTH)
        self.proj = nn.Linear(WIDTH, WIDTH)
        self.ln2 = nn.LayerNorm(WIDTH)
        self.mlp = nn.Sequential(
            nn.Linear(WIDTH, 4 * WIDTH), nn.GELU(), nn.Linear(4 * WIDTH, WIDTH)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(WIDTH, dim=-1)
        q, k, v = (z.view(b, t, HEADS, HEAD_DIM).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(b, t, WIDTH))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    """Token and position embeddings, `LAYERS` blocks, a final norm, tied logits (GPT-2)."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.tokens = nn.Embedding(VOCAB, WIDTH)
        self.positions = nn.Embedding(SEQ, WIDTH)
        self.blocks = nn.ModuleList(Block() for _ in range(LAYERS))
        self.ln = nn.LayerNorm(WIDTH)
        self.head = nn.Linear(WIDTH, VOCAB, bias=False)
        self.head.weight = self.tokens.weight

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.tokens(idx) + self.positions(torch.arange(idx.shape[1]))
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln(x))


def _train(model: GPT) -> None:
    idx = torch.randint(0, VOCAB, (BATCH, SEQ))
    logits = model(idx)
    F.cross_entropy(logits.reshape(-1, VOCAB), idx.reshape(-1)).backward()


# The core formula (PaLM convention, tied embeddings: N is the matmul weights, logits included).
SHAPE = TransformerShape(
    layers=LAYERS, hidden=WIDTH, heads=HEADS, vocab=VOCAB, tied_embeddings=True
)
PER_TOKEN = transformer_flops_per_token(SHAPE, seq_len=SEQ, convention="palm")
ANALYTICAL = PER_TOKEN.model * BATCH * SEQ
# The 5th matmul of each SDPA backward call: the scores Q·K^T recomputed, 2*b*H*T*T*Q per layer.
RESCORE = LAYERS * 2 * BATCH * HEADS * SEQ * SEQ * HEAD_DIM


def test_the_core_formula_is_6n_plus_12_lhqt() -> None:
    n = LAYERS * 12 * WIDTH * WIDTH + VOCAB * WIDTH  # q,k,v,o + 4h MLP per layer; tied logits
    assert PER_TOKEN.model == 6 * n + 12 * LAYERS * HEADS * HEAD_DIM * SEQ


def test_counted_gpt_model_flops_are_the_analytical_formula(tmp_path: Path) -> None:
    # Through the agent's counting path, into its step reports.
    model = GPT()
    agent = jsonl_agent(tmp_path, model)
    for _ in range(3):
        with agent.step():
            _train(model)
    agent.close()
    batches = [decode_batch(line) for line in (tmp_path / "out.jsonl").read_text().splitlines()]
    reports = [r for batch in batches for r in batch.reports]
    assert len(reports) == 3
    for report in reports:
        assert math.isclose(report.model_flops, ANALYTICAL, rel_tol=1e-3)
        assert report.recompute_flops == RESCORE
        assert report.hardware_flops == report.model_flops + RESCORE
        peak = batches[0].peak_flops
        assert peak is not None
        gap = hfu(report.model_flops, report.recompute_flops, peak, report.wall_s) - mfu(
            report.model_flops, peak, report.wall_s
        )
        assert math.isclose(gap, RESCORE / (peak * report.wall_s), rel_tol=1e-9)


def test_the_split_is_exact_for_this_model() -> None:
    # Biases and norms do no matmul FLOPs, so the counted model FLOPs are the formula exactly.
    step = count_step_flops(lambda: _train(GPT()))
    assert (step.model_flops, step.recompute_flops) == (ANALYTICAL, RESCORE)


def test_math_attention_has_nothing_to_move() -> None:
    # The math backend is plain matmuls that keep the scores: four backward matmuls, no recompute.
    from torch.nn.attention import SDPBackend, sdpa_kernel

    with sdpa_kernel(SDPBackend.MATH):
        step = count_step_flops(lambda: _train(GPT()))
    assert (step.model_flops, step.recompute_flops) == (ANALYTICAL, 0)


def _meta(*shape: int) -> torch.Tensor:
    return torch.empty(*shape, device="meta")


def _cuda_backward_calls() -> dict[str, object]:
    """Each CUDA SDPA backward op FlopCounterMode has a formula for, called on meta tensors of
    (batch, heads, seq, dim) = (2, 4, 16, 8); the raw kernels take (batch, seq, heads, dim)."""
    aten = torch.ops.aten
    b, h, s, d = 2, 4, 16, 8
    q, k, v, o, go = (_meta(b, h, s, d) for _ in range(5))
    lse, seed = _meta(b, h, s), torch.empty(2, dtype=torch.int64, device="meta")
    bshd = [z.transpose(1, 2) for z in (go, q, k, v, o)]
    return {
        "flash": lambda: aten._scaled_dot_product_flash_attention_backward(
            go, q, k, v, o, lse, None, None, s, s, 0.0, False, seed, seed
        ),
        "efficient": lambda: aten._scaled_dot_product_efficient_attention_backward(
            go, q, k, v, _meta(b, h, s, s), o, lse, seed, seed, 0.0, [True, True, True, False]
        ),
        "cudnn": lambda: aten._scaled_dot_product_cudnn_attention_backward(
            go, q, k, v, o, lse, seed, seed, _meta(b, h, s, s), None, None, s, s, 0.0, False
        ),
        "raw flash": lambda: aten._flash_attention_backward(
            *bshd, lse, None, None, s, s, 0.0, False, seed, seed
        ),
        "raw efficient": lambda: aten._efficient_attention_backward(
            *bshd[:4], None, bshd[4], None, None, s, s, lse, 0.0, seed, seed, 0, False
        ),
    }


@pytest.mark.parametrize("kernel", sorted(_cuda_backward_calls()))
def test_every_cuda_sdpa_backward_moves_its_recompute(kernel: str) -> None:
    # torch counts these with the same five-matmul formula; one fifth (Dq = Dv) is the recompute.
    with StepFlopCount() as count:
        _cuda_backward_calls()[kernel]()
    step = count.result
    assert step.recompute_flops > 0
    assert step.model_flops == 4 * step.recompute_flops


def test_every_attention_backward_torch_counts_is_split() -> None:
    # A torch upgrade that adds an attention backward formula must not slip past the split.
    # flex_attention_backward is a higher-order op: eager flex runs plain matmuls (counted as
    # such) and FlopCounterMode's registry entry serves compiled graphs only.
    import torch.nn.attention.varlen  # noqa: F401  (registers the varlen ops' formulas)
    from mfuscope.agent._counted_flops import RankFlopCounter

    split = RankFlopCounter(display=False).attention_backward_ops
    names = {str(op) for op in flop_registry}
    backward = {n for n in names if "att" in n and "backward" in n} - {"flex_attention_backward"}
    assert backward
    assert backward <= {str(op) for op in split}


@pytest.mark.parametrize(
    ("query", "key", "value"),
    [
        ((2, 4, 16, 8), (2, 4, 16, 8), (2, 4, 16, 8)),
        ((2, 8, 16, 8), (2, 2, 24, 8), (2, 2, 24, 8)),  # GQA, Tk != Tq
        ((1, 4, 16, 8), (1, 4, 16, 8), (1, 4, 16, 32)),  # value head dim != query head dim
    ],
)
def test_recompute_share_is_the_scores_matmul(
    query: tuple[int, ...], key: tuple[int, ...], value: tuple[int, ...]
) -> None:
    b, h, tq, dq = query
    grad_out = (b, h, tq, value[-1])
    full = sdpa_backward_flop_count(grad_out, query, key, value)
    share = attention_backward_recompute(full, _meta(*query), _meta(*value))
    assert share == 2 * b * h * tq * key[2] * dq


def test_attention_backward_inside_a_recompute_context_counts_once() -> None:
    # A recompute context that itself runs attention's backward: all of it is recompute, and
    # the score recompute is neither subtracted from model FLOPs twice nor added twice.
    q, k, v = (torch.randn(1, 2, 16, 8, requires_grad=True) for _ in range(3))
    counter = RecomputeCounter()

    def step() -> None:
        with counter.context():
            out = F.scaled_dot_product_attention(q, k, v)
            torch.autograd.grad(out.sum(), (q, k, v))

    result = count_step_flops(step)
    per_matmul = 2 * 2 * 16 * 16 * 8
    assert result.model_flops == 0
    assert result.recompute_flops == counter.total_flops == (2 + 5) * per_matmul
