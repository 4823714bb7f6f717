"""A small GPT-style decoder and a learnable synthetic token stream, for the demo job.

The model is deliberately ordinary (pre-LayerNorm blocks, causal scaled-dot-product attention, a
4x GELU MLP, untied embeddings) so that its FLOPs follow the textbook transformer count. It can be
cut into consecutive pipeline stages: stage `i` owns blocks `[first_layer, last_layer)`, the first
stage also owns the embeddings and the last one the final norm, the head and the loss.

The data is a fixed random Markov chain over the vocabulary in which every token has
`successors_per_token` equally likely successors, so the loss falls from ln(vocab) towards the
chain's entropy ln(successors_per_token) as the model learns: a visible sign that training works.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint, noop_context_fn

__all__ = ["GPTConfig", "GPTStage", "MarkovTokens", "stage_layer_ranges"]

ContextFn = Callable[[], tuple[AbstractContextManager[Any], AbstractContextManager[Any]]]


@dataclass(frozen=True)
class GPTConfig:
    """Shape of the model. `checkpoint_every=k` checkpoints every k-th layer (0: none)."""

    vocab_size: int = 64
    seq_len: int = 64
    d_model: int = 128
    n_heads: int = 4
    n_layers: int = 4
    checkpoint_every: int = 2

    def __post_init__(self) -> None:
        for name in ("vocab_size", "seq_len", "d_model", "n_heads", "n_layers"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.d_model % self.n_heads:
            raise ValueError(f"d_model {self.d_model} is not a multiple of n_heads {self.n_heads}")
        if self.checkpoint_every < 0:
            raise ValueError(f"checkpoint_every must be >= 0, got {self.checkpoint_every}")

    def is_checkpointed(self, layer: int) -> bool:
        """Layers k-1, 2k-1, ... are checkpointed (k=2: every other layer, from the 2nd)."""
        k = self.checkpoint_every
        return k > 0 and layer % k == k - 1


def stage_layer_ranges(n_layers: int, n_stages: int) -> list[tuple[int, int]]:
    """Split `n_layers` blocks into `n_stages` consecutive ranges as evenly as possible."""
    if not 1 <= n_stages <= n_layers:
        raise ValueError(
            f"need 1 <= n_stages <= n_layers, got {n_stages} stages, {n_layers} layers"
        )
    bounds = [round(i * n_layers / n_stages) for i in range(n_stages + 1)]
    return list(itertools.pairwise(bounds))


class _Block(nn.Module):  # type: ignore[misc]
    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.n_heads = config.n_heads
        self.ln_attn = nn.LayerNorm(config.d_model)
        self.qkv = nn.Linear(config.d_model, 3 * config.d_model)
        self.proj = nn.Linear(config.d_model, config.d_model)
        self.ln_mlp = nn.LayerNorm(config.d_model)
        self.mlp = nn.Sequential(
            nn.Linear(config.d_model, 4 * config.d_model),
            nn.GELU(),
            nn.Linear(4 * config.d_model, config.d_model),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, seq, width = x.shape
        q, k, v = self.qkv(self.ln_attn(x)).split(width, dim=-1)
        heads = (batch, seq, self.n_heads, width // self.n_heads)
        q, k, v = (t.view(heads).transpose(1, 2) for t in (q, k, v))
        attended = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(attended.transpose(1, 2).reshape(batch, seq, width))
        return x + self.mlp(self.ln_mlp(x))


class GPTStage(nn.Module):  # type: ignore[misc]
    """Blocks `[first_layer, last_layer)` of the model; the whole model when it spans all layers.

    `forward(x, targets)`: on the first stage `x` holds token ids (batch, seq), else activations
    (batch, seq, d_model). The last stage returns the mean cross-entropy loss (nats per token)
    when `targets` are given; other stages return activations.
    """

    def __init__(
        self,
        config: GPTConfig,
        first_layer: int = 0,
        last_layer: int | None = None,
        context_fn: ContextFn = noop_context_fn,
    ) -> None:
        super().__init__()
        last = config.n_layers if last_layer is None else last_layer
        if not 0 <= first_layer < last <= config.n_layers:
            raise ValueError(f"bad layer range [{first_layer}, {last}) of {config.n_layers}")
        self.config = config
        self.context_fn = context_fn
        self.is_first = first_layer == 0
        self.is_last = last == config.n_layers
        self.layer_ids = list(range(first_layer, last))
        if self.is_first:
            self.tok_emb = nn.Embedding(config.vocab_size, config.d_model)
            self.pos_emb = nn.Embedding(config.seq_len, config.d_model)
        self.blocks = nn.ModuleList(_Block(config) for _ in self.layer_ids)
        if self.is_last:
            self.ln_f = nn.LayerNorm(config.d_model)
            self.head = nn.Linear(config.d_model, config.vocab_size, bias=False)

    @property
    def checkpointed_layers(self) -> list[int]:
        return [i for i in self.layer_ids if self.config.is_checkpointed(i)]

    def forward(self, x: torch.Tensor, targets: torch.Tensor | None = None) -> torch.Tensor:
        if self.is_first:
            positions = torch.arange(x.shape[1], device=x.device)
            x = self.tok_emb(x) + self.pos_emb(positions)
        for layer, block in zip(self.layer_ids, self.blocks, strict=True):
            if self.config.is_checkpointed(layer):
                x = checkpoint(block, x, use_reentrant=False, context_fn=self.context_fn)
            else:
                x = block(x)
        if not self.is_last:
            return x
        logits = self.head(self.ln_f(x))
        if targets is None:
            return logits
        return F.cross_entropy(logits.flatten(0, 1), targets.flatten())


class MarkovTokens:
    """Batches from a fixed random Markov chain; deterministic in (seed, step, shard)."""

    def __init__(self, config: GPTConfig, seed: int = 0, successors_per_token: int = 4) -> None:
        if not 1 <= successors_per_token <= config.vocab_size:
            raise ValueError(f"successors_per_token must be in [1, {config.vocab_size}]")
        self.config = config
        self.seed = seed
        chain = torch.Generator().manual_seed(seed)
        # Distinct successors per token, so the entropy floor is exactly ln(successors).
        self.successors = torch.stack(
            [
                torch.randperm(config.vocab_size, generator=chain)[:successors_per_token]
                for _ in range(config.vocab_size)
            ]
        )
        self.entropy_floor_nats = math.log(successors_per_token)

    def batch(self, step: int, shard: int, batch_size: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(inputs, targets), each (batch_size, seq_len) int64; targets are inputs shifted by 1."""
        gen = torch.Generator().manual_seed((self.seed * 1_000_003 + step) * 1_009 + shard)
        width = self.successors.shape[1]
        tokens = torch.empty(batch_size, self.config.seq_len + 1, dtype=torch.long)
        tokens[:, 0] = torch.randint(self.config.vocab_size, (batch_size,), generator=gen)
        choice = torch.randint(width, (batch_size, self.config.seq_len), generator=gen)
        for t in range(self.config.seq_len):
            tokens[:, t + 1] = self.successors[tokens[:, t], choice[:, t]]
        return tokens[:, :-1], tokens[:, 1:]
