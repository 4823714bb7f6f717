"""Analytical training FLOPs of a dense or MoE decoder transformer, per token.

Notation: L layers, h hidden size, H query heads, K key/value heads (GQA; K = H is plain
multi-head attention, K = 1 multi-query), Q head dimension, F feed-forward hidden size,
V vocabulary, T sequence length, E experts and k experts per token (MoE), N parameters.

**Why 6 per parameter.** A matmul of an [m, n] input with an [n, p] weight does m*n*p
multiply-adds = 2*m*n*p FLOPs, i.e. 2 FLOPs per weight per token in the forward pass. The backward
pass computes two matmuls of the same size per weight (the gradient w.r.t. the input and w.r.t.
the weight), 4 FLOPs per weight per token. Forward + backward = 6 FLOPs per parameter per token.

**Attention.** Per layer and token the forward pass also multiplies the query with T keys
(Q*K^T: 2*H*Q*T FLOPs) and the T scores with the values (2*H*Q*T): 4*L*H*Q*T in the forward
pass, 12*L*H*Q*T for training. GQA shares K/V heads between query heads, which shrinks the K/V
projections (fewer parameters) but not these score FLOPs: every query head still attends to T keys.
Both papers count the full T x T score matrix; a causal mask would halve it but neither convention
(nor torch's FlopCounterMode) takes that discount, and we follow them.

**Two conventions.**

- ``"palm"`` (Chowdhery et al. 2022, PaLM, appendix B): model FLOPs per token = 6N + 12*L*H*Q*T,
  with N the parameter count as given (for MoE: the *active* parameters). With a shape and no N,
  N is counted from the shape including the input embedding matrix when it is untied (PaLM's N is
  literally "the number of parameters").
- ``"megatron"`` (Narayanan et al. 2021, arXiv 2104.04473, eq. 3): count only the GEMMs from the
  shape: per layer 2*(attention + active MLP weights) + 4*T*H*Q forward, plus the logit layer
  2*V*h (the input embedding is a lookup, no FLOPs; tied or not, the logit GEMM exists). Training
  is 3x forward. With H*Q = h, K = H, F = 4h, a plain MLP and full recomputation this is exactly
  eq. 3: F = 96*B*s*l*h^2 * (1 + s/(6h) + V/(16*l*h)) per iteration of B sequences of length s.

**Recomputation** (activation checkpointing) redoes forward work in the backward pass. It is
hardware work, never model work: it goes to `recompute` (HFU numerator), not to `model` (MFU).

- ``none``: 0.
- ``full``: one extra forward of every transformer layer: L*(2*P_layer + 4*T*H*Q) per token, where
  P_layer is the layer's active matmul weights (the logit layer is not recomputed: eq. 3's
  V/(16*l*h) term is 6*B*s*h*V = 3 passes, not 4). With only N known (no shape) the whole model
  is taken as recomputed, 2N per token: the "4 instead of 3" rule of the BLOOM/ml-engineering
  TFLOPs formula (source: ml-engineering "Networking", "Calculating TFLOPS").
- ``selective`` (Korthikanti et al. 2022, arXiv 2205.05198): only the attention core (Q*K^T,
  softmax, scores*V) is recomputed: 4*L*H*Q*T per token. Needs the shape.

Parameters counted from a shape are the matmul weights: biases and norm scales (O(h) per layer)
are left out, which is why the count sits ~0.3% under Megatron's eq. 2 for small models.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = [
    "CONVENTIONS",
    "RECOMPUTE_MODES",
    "ParamCounts",
    "TokenFlops",
    "TransformerShape",
    "count_params",
    "transformer_flops_per_token",
]

RECOMPUTE_MODES: tuple[str, ...] = ("none", "selective", "full")
CONVENTIONS: tuple[str, ...] = ("palm", "megatron")


def _positive(name: str, value: int | None) -> None:
    if value is not None and value < 1:
        raise ValueError(f"{name} must be >= 1, got {value}")


@dataclass(frozen=True)
class TransformerShape:
    """The shape of a decoder-only transformer. Defaults: Q = h/H, K = H, F = 4h, plain MLP."""

    layers: int
    hidden: int
    heads: int | None = None
    kv_heads: int | None = None
    head_dim: int | None = None
    ffn_hidden: int | None = None
    gated_mlp: bool = False  # SwiGLU/GeGLU: three F x h matrices instead of two
    vocab: int = 0
    tied_embeddings: bool = False
    experts: int = 1
    experts_per_token: int = 1

    def __post_init__(self) -> None:
        for name in ("layers", "hidden", "heads", "kv_heads", "head_dim", "ffn_hidden"):
            _positive(name, getattr(self, name))
        _positive("experts", self.experts)
        _positive("experts_per_token", self.experts_per_token)
        if self.vocab < 0:
            raise ValueError(f"vocab must be >= 0, got {self.vocab}")
        if self.experts_per_token > self.experts:
            raise ValueError(
                f"experts_per_token ({self.experts_per_token}) exceeds experts ({self.experts})"
            )
        if self.heads is None and (self.kv_heads is not None or self.head_dim is not None):
            raise ValueError("kv_heads / head_dim need heads")
        if self.heads is not None and self.head_dim is None and self.hidden % self.heads:
            raise ValueError(f"hidden {self.hidden} is not divisible by heads {self.heads}")
        if self.heads is not None and self.kv_heads is not None and self.heads % self.kv_heads:
            raise ValueError(f"heads {self.heads} is not a multiple of kv_heads {self.kv_heads}")

    @property
    def query_heads(self) -> int:
        return self.heads if self.heads is not None else 1

    @property
    def dim_per_head(self) -> int:
        """Q: `head_dim`, else h/H (with no heads given, one head of width h)."""
        if self.head_dim is not None:
            return self.head_dim
        return self.hidden // self.query_heads

    @property
    def attention_width(self) -> int:
        """H*Q: the width of the query (and attention output) projection."""
        return self.query_heads * self.dim_per_head

    @property
    def kv_width(self) -> int:
        """K*Q: the width of each of the key and value projections."""
        kv = self.kv_heads if self.kv_heads is not None else self.query_heads
        return kv * self.dim_per_head

    @property
    def ffn(self) -> int:
        return self.ffn_hidden if self.ffn_hidden is not None else 4 * self.hidden


@dataclass(frozen=True)
class ParamCounts:
    """Matmul-weight parameter counts of a `TransformerShape`.

    `total` counts every expert and both embedding matrices (once if tied); `active` counts the
    weights one token uses (k of E experts). `embedding` is the input lookup table (0 when tied:
    it is then the logit matrix), `logits` the output projection V*h.
    """

    attention_per_layer: int
    mlp_per_expert: int
    router_per_layer: int
    embedding: int
    logits: int
    total: int
    active: int
    layer_active: int  # P_layer: active matmul weights of one layer (attention + router + k MLPs)


def count_params(shape: TransformerShape) -> ParamCounts:
    """Count the matmul weights of `shape` (biases and norm scales excluded)."""
    h = shape.hidden
    attention = h * shape.attention_width + 2 * h * shape.kv_width + shape.attention_width * h
    mlp = (3 if shape.gated_mlp else 2) * h * shape.ffn
    router = h * shape.experts if shape.experts > 1 else 0
    logits = shape.vocab * h
    embedding = 0 if shape.tied_embeddings else shape.vocab * h
    layer_total = attention + router + shape.experts * mlp
    layer_active = attention + router + shape.experts_per_token * mlp
    return ParamCounts(
        attention_per_layer=attention,
        mlp_per_expert=mlp,
        router_per_layer=router,
        embedding=embedding,
        logits=logits,
        total=shape.layers * layer_total + embedding + logits,
        active=shape.layers * layer_active + embedding + logits,
        layer_active=layer_active,
    )


@dataclass(frozen=True)
class TokenFlops:
    """Training FLOPs per token. `model` is the MFU numerator's share, `recompute` the extra
    forward work of activation recomputation; `hardware = model + recompute` (HFU numerator).
    `attention` is the part of `model` spent on attention scores (12*L*H*Q*T)."""

    model: float
    recompute: float
    attention: float
    params_used: float  # N (palm) or the GEMM weights a token touches (megatron)

    @property
    def hardware(self) -> float:
        return self.model + self.recompute


def _attention_forward(shape: TransformerShape, seq_len: int) -> float:
    # Q*K^T and scores*V: 2 * 2 * H*Q*T FLOPs per layer per token in the forward pass.
    return 4.0 * shape.layers * shape.attention_width * seq_len


def transformer_flops_per_token(
    shape: TransformerShape | None = None,
    *,
    seq_len: int,
    params: float | None = None,
    recompute: str = "none",
    convention: str = "palm",
    include_attention: bool = True,
) -> TokenFlops:
    """Training FLOPs per token (forward + backward) for one sequence length `seq_len` (tokens).

    `params` is N (for MoE: active parameters); when given it is taken as is and the `shape`, if
    any, only supplies the attention (and recompute) terms. With ``convention="megatron"`` the
    shape is required and `params` is ignored (the GEMMs are counted from the shape).
    """
    if recompute not in RECOMPUTE_MODES:
        raise ValueError(f"recompute must be one of {RECOMPUTE_MODES}, got {recompute!r}")
    if convention not in CONVENTIONS:
        raise ValueError(f"convention must be one of {CONVENTIONS}, got {convention!r}")
    if seq_len < 1:
        raise ValueError(f"seq_len must be >= 1, got {seq_len}")
    if params is not None and not params > 0:
        raise ValueError(f"params must be > 0, got {params}")
    if shape is None and params is None:
        raise ValueError("need the parameter count, the shape, or both")
    if recompute == "selective" and shape is None:
        raise ValueError("selective recompute re-runs attention only: it needs the shape")

    attention_fwd = 0.0
    layer_fwd = None  # forward FLOPs of all transformer layers (for full recompute)
    counts = count_params(shape) if shape is not None else None
    if shape is not None and counts is not None:
        attention_fwd = _attention_forward(shape, seq_len) if include_attention else 0.0
        layer_fwd = 2.0 * shape.layers * counts.layer_active + attention_fwd

    if convention == "megatron":
        if shape is None or counts is None or layer_fwd is None:
            raise ValueError("the megatron convention counts GEMMs from the shape: give the shape")
        used = float(shape.layers * counts.layer_active + counts.logits)
        model = 3.0 * (layer_fwd + 2.0 * counts.logits)
    else:
        if params is not None:
            used = float(params)
        else:
            assert counts is not None
            used = float(counts.active)
        model = 6.0 * used + 3.0 * attention_fwd

    if recompute == "none":
        extra = 0.0
    elif recompute == "selective":
        assert shape is not None
        extra = _attention_forward(shape, seq_len)
    elif layer_fwd is not None:
        extra = layer_fwd
    else:
        extra = 2.0 * used
    return TokenFlops(model=model, recompute=extra, attention=3.0 * attention_fwd, params_used=used)
