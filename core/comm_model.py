"""The communication what-if: bytes and time per step for each parallelism axis, and whether it
can hide under compute.

Model (per rank, per training step; sources in comments below):

- Rank layout, innermost first: ``tp``, then ``dp`` (``ep`` groups are carved out of consecutive
  ``dp`` ranks), then ``pp`` outermost (Megatron-LM's default order). A group of size n whose
  ranks are `stride` apart stays inside one node when ``stride * n`` divides into
  ``gpus_per_node``; otherwise it crosses nodes and runs at the inter-node tier.
- Collective time follows nccl-tests: a collective of size S (nccl-tests' S: the buffer for
  all_reduce, the gathered size for all_gather / reduce_scatter) reaches busbw at best, so
  ``t = alpha + bus_factor(op, n) * S / beta`` with beta the tier's unidirectional rate
  (`bandwidth.py`), one alpha per collective (docs/definitions.md#alpha-beta-model).
- TP (Megatron, Shoeybi et al. 2019): 2 all-reduces of the layer activation ``b*T*h`` per layer in
  the forward pass and 2 in the backward pass; full recomputation re-runs the forward ones (2 more).
  With sequence parallelism each all-reduce becomes a reduce-scatter plus an all-gather of the same
  S (same bus bytes). Cross-checked with "Interconnect - the bandwidth pyramid" (70B, 80 layers, 320
  all-reduces of ~50 MB per step).
- DP: one all-reduce of the gradients per step (DDP), S = parameters on this rank x grad bytes.
  FSDP / ZeRO-3: an all-gather of the parameters before the forward and before the backward of each
  micro-batch, and one reduce-scatter of the gradients per step.
- PP: per micro-batch one activation send forward and one gradient send backward across each stage
  boundary (p2p, bus factor 1).
- EP (MoE): per MoE layer and micro-batch, 2 all-to-alls forward (dispatch, combine) and 2 backward
  (+2 with full recomputation), S = ``b*T*h*k`` elements (each token goes to k experts).
- Pipeline bubble (GPipe / 1F1B): the idle share of a step is ``(p-1) / (m+p-1)`` for m
  micro-batches over p stages (source: "The Memory Hierarchy of a Cluster").

Hiding: the overlap window of an axis is the compute it can run under: the gradient reductions of
DP / FSDP only the backward pass (and the recomputation inside it); TP, FSDP gathers, PP sends and
EP all-to-alls the whole compute of the step (TP and EP only when the framework overlaps them,
e.g. Megatron's TP comm overlap; by default they sit on the critical path). ``hideable`` means
``seconds_per_step <= overlap_window_s``: the axis *can* hide, not that it does. Axes that share a
tier also share its bandwidth; that contention is not modelled.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from mfuscope.core.bandwidth import LinkModel, bus_factor
from mfuscope.core.flops import RECOMPUTE_MODES

__all__ = [
    "AxisComm",
    "CommWhatIf",
    "ParallelLayout",
    "StepWork",
    "axis_tier",
    "backward_share",
    "collective_seconds",
    "estimate_step_comm",
    "pipeline_bubble_fraction",
]


def pipeline_bubble_fraction(stages: int, microbatches: int) -> float:
    """Idle share of a pipelined step, ``(p-1) / (m+p-1)`` for p stages and m micro-batches."""
    if stages < 1 or microbatches < 1:
        raise ValueError(f"stages and microbatches must be >= 1, got {stages}, {microbatches}")
    return (stages - 1) / (microbatches + stages - 1)


def collective_seconds(op: str, group_size: int, size_bytes: float, link: LinkModel) -> float:
    """Alpha-beta time of one collective: ``alpha + bus_factor * S / beta`` seconds (0 if n = 1)."""
    if size_bytes < 0:
        raise ValueError(f"size_bytes must be >= 0, got {size_bytes}")
    if group_size == 1:
        return 0.0
    return link.alpha_s + bus_factor(op, group_size) * size_bytes / link.beta_bytes_per_s


def backward_share(model_flops: float, recompute_flops: float) -> float:
    """Share of a step's compute spent in the backward pass (recomputation runs inside it).

    Backward is 2/3 of the model FLOPs (two matmuls per weight against one forward).
    """
    total = model_flops + recompute_flops
    if not total > 0:
        raise ValueError("model_flops + recompute_flops must be > 0")
    return (2.0 / 3.0 * model_flops + recompute_flops) / total


@dataclass(frozen=True)
class ParallelLayout:
    """Degrees of each parallelism axis and the node size (GPUs sharing one intra-node fabric)."""

    tp: int = 1
    pp: int = 1
    dp: int = 1
    ep: int = 1
    gpus_per_node: int = 8
    fsdp: bool = False
    sequence_parallel: bool = False

    def __post_init__(self) -> None:
        for name in ("tp", "pp", "dp", "ep", "gpus_per_node"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.dp % self.ep:
            raise ValueError(f"ep ({self.ep}) must divide dp ({self.dp}): EP groups are DP ranks")

    @property
    def world_size(self) -> int:
        return self.tp * self.pp * self.dp


def _stride_and_size(axis: str, layout: ParallelLayout) -> tuple[int, int]:
    if axis == "tp":
        return 1, layout.tp
    if axis in ("dp", "ep"):
        return layout.tp, layout.dp if axis == "dp" else layout.ep
    if axis == "pp":
        return layout.tp * layout.dp, layout.pp
    raise ValueError(f"unknown axis {axis!r}; expected tp, dp, ep or pp")


def axis_tier(axis: str, layout: ParallelLayout) -> str:
    """``"intra_node"`` when every group of `axis` fits in one node, else ``"inter_node"``."""
    stride, size = _stride_and_size(axis, layout)
    span = stride * size
    fits = span <= layout.gpus_per_node and layout.gpus_per_node % span == 0
    return "intra_node" if fits or size == 1 else "inter_node"


@dataclass(frozen=True)
class StepWork:
    """What one training step moves. Sizes in elements unless named bytes; `params` is the total
    parameter count, `expert_params` the part of it inside MoE experts (sharded over ep).

    The activation traffic of TP, PP and EP needs `layers`, `hidden`, `seq_len` and
    `global_batch` (sequences per step); DP traffic needs only `params`, so those may stay 0 for a
    pure data-parallel question.
    """

    params: float
    layers: int = 0
    hidden: int = 0
    seq_len: int = 0
    global_batch: int = 0
    microbatches: int = 1  # per pipeline and step (m)
    expert_params: float = 0.0
    moe_layers: int = 0
    experts_per_token: int = 1
    activation_bytes: int = 2
    grad_bytes: int = 2
    param_bytes: int = 2
    recompute: str = "none"

    def __post_init__(self) -> None:
        for name in ("layers", "hidden", "seq_len", "global_batch", "moe_layers"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        for name in ("microbatches", "experts_per_token", "activation_bytes", "grad_bytes"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.param_bytes < 1:
            raise ValueError(f"param_bytes must be >= 1, got {self.param_bytes}")
        if self.recompute not in RECOMPUTE_MODES:
            raise ValueError(f"recompute must be one of {RECOMPUTE_MODES}")
        if not (self.params >= 0 and math.isfinite(self.params)):
            raise ValueError(f"params must be a finite number >= 0, got {self.params}")
        if not 0 <= self.expert_params <= self.params:
            raise ValueError("expert_params must be within [0, params]")
        if self.moe_layers > self.layers:
            raise ValueError("moe_layers cannot exceed layers")


# What sizes the activations that TP, PP and EP move (StepWork fields).
ACTIVATION_INPUTS = ("layers", "hidden", "seq_len", "global_batch")
# Axes whose traffic frameworks overlap with compute by default: DDP's bucketed gradient
# all-reduce and FSDP's prefetched gathers (dp), pipeline p2p posted ahead (pp). TP and EP
# collectives sit on the critical path unless the framework overlaps them (e.g. Megatron-LM's
# --tp-comm-overlap), so for them "can hide" is a possibility, not the default.
OVERLAPPED_BY_DEFAULT = frozenset({"dp", "pp"})


@dataclass(frozen=True)
class AxisComm:
    """One kind of collective of one axis, per rank and step."""

    axis: str
    op: str
    tier: str
    group_size: int
    calls_per_step: int
    bytes_per_call: float  # S as nccl-tests counts it
    seconds_per_step: float
    overlap_window_s: float
    hideable: bool

    @property
    def bytes_per_step(self) -> float:
        return self.calls_per_step * self.bytes_per_call

    @property
    def bus_bytes_per_step(self) -> float:
        """Bytes each rank's link carries per step (S x nccl-tests bus factor x calls)."""
        return self.bytes_per_step * bus_factor(self.op, self.group_size)


@dataclass(frozen=True)
class CommWhatIf:
    axes: tuple[AxisComm, ...]
    pipeline_bubble_fraction: float
    compute_s: float  # compute per device per step: the largest overlap window
    micro_batch_size: float  # sequences per micro-batch per pipeline


def estimate_step_comm(
    work: StepWork,
    layout: ParallelLayout,
    links: Mapping[str, LinkModel],
    compute_s: float,
    backward_fraction: float = 2.0 / 3.0,
) -> CommWhatIf:
    """Per-axis bytes and time per step for `work` on `layout` (see the module docstring).

    `links` maps ``"intra_node"`` / ``"inter_node"`` to alpha-beta models; `compute_s` is the
    compute time of one device per step (s); `backward_fraction` the share of it in the backward
    pass (`backward_share`).
    """
    if not (compute_s >= 0 and math.isfinite(compute_s)):
        raise ValueError(f"compute_s must be a finite number >= 0, got {compute_s}")
    if not 0 <= backward_fraction <= 1:
        raise ValueError(f"backward_fraction must be within [0, 1], got {backward_fraction}")
    m = work.microbatches
    b = 0.0
    sized_axes = [
        f"{axis}={degree}"
        for axis, degree, used in (
            ("tp", layout.tp, True),
            ("pp", layout.pp, True),
            ("ep", layout.ep, work.moe_layers > 0),
        )
        if degree > 1 and used
    ]
    if sized_axes:
        missing = [name for name in ACTIVATION_INPUTS if getattr(work, name) < 1]
        if missing:
            raise ValueError(
                f"the {', '.join(sized_axes)} traffic is sized by the activations, which need "
                f"{', '.join(missing)} (not given)"
            )
        replicas = layout.dp * m
        if work.global_batch % replicas:
            raise ValueError(
                f"global_batch {work.global_batch} is not divisible by dp x microbatches "
                f"({replicas})"
            )
        b = work.global_batch / replicas
    elif work.global_batch:
        b = work.global_batch / (layout.dp * m)
    activation = float(b * work.seq_len * work.hidden * work.activation_bytes)
    # Uneven stages: the busiest stage (ceil) sets the pace of the pipeline.
    layers_per_stage = math.ceil(work.layers / layout.pp)
    dense = (work.params - work.expert_params) / (layout.tp * layout.pp)
    params_here = dense + work.expert_params / (layout.tp * layout.pp * layout.ep)
    full = work.recompute == "full"
    out: list[AxisComm] = []

    def add(axis: str, op: str, size: int, calls: int, nbytes: float, window: float) -> None:
        if size == 1 or calls <= 0:
            return
        tier = axis_tier(axis, layout)
        per_call = collective_seconds(op, size, nbytes, links[tier])
        seconds = calls * per_call
        out.append(
            AxisComm(axis, op, tier, size, calls, nbytes, seconds, window, seconds <= window)
        )

    tp_calls = m * layers_per_stage * (6 if full else 4)
    if layout.sequence_parallel:
        add("tp", "reduce_scatter", layout.tp, tp_calls, activation, compute_s)
        add("tp", "all_gather", layout.tp, tp_calls, activation, compute_s)
    else:
        add("tp", "all_reduce", layout.tp, tp_calls, activation, compute_s)

    backward_window = compute_s * backward_fraction
    if layout.fsdp:
        add("dp", "all_gather", layout.dp, 2 * m, params_here * work.param_bytes, compute_s)
        add("dp", "reduce_scatter", layout.dp, 1, params_here * work.grad_bytes, backward_window)
    else:
        add("dp", "all_reduce", layout.dp, 1, params_here * work.grad_bytes, backward_window)

    add("pp", "send", layout.pp, 2 * m, activation, compute_s)

    moe_per_stage = math.ceil(work.moe_layers / layout.pp)
    ep_calls = m * moe_per_stage * (6 if full else 4)
    add("ep", "all_to_all", layout.ep, ep_calls, activation * work.experts_per_token, compute_s)

    return CommWhatIf(
        axes=tuple(out),
        pipeline_bubble_fraction=pipeline_bubble_fraction(layout.pp, m),
        compute_s=compute_s,
        micro_batch_size=b,
    )
