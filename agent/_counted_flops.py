"""Count the FLOPs of one real training step with torch's `FlopCounterMode`, recompute apart.

`count_step_flops(step_fn)` runs `step_fn` once under `RankFlopCounter` (a `FlopCounterMode`) and
returns `StepFlops(model_flops, recompute_flops)`. Four things torch does not do for us:

1. **CPU attention.** `FlopCounterMode` has formulas for the CUDA SDPA kernels but counts 0 for
   ``aten._scaled_dot_product_flash_attention_for_cpu`` and its backward. We register them through
   `custom_mapping` with torch's own `sdpa_flop_count` / `sdpa_backward_flop_count` (FlopCounterMode
   applies `shape_wrapper` to custom entries itself, so the adapters below receive shapes).
2. **Recomputation.** Under activation checkpointing the forward of a checkpointed region runs
   again during the backward pass; those FLOPs are hardware work (HFU) but not model work (MFU).
   `torch.utils.checkpoint.checkpoint(..., use_reentrant=False, context_fn=...)` lets us wrap
   exactly the recomputation in a context. `RecomputeCounter.context()` is that context: it counts
   the recomputed FLOPs with a nested `FlopCounterMode`. The outer counter of `count_step_flops`
   sees those ops too (nested dispatch modes both count), so
   ``model_flops = outer total - recompute total``. (Only recomputation that ran under the outer
   counter's dispatch mode is subtracted: the calling thread, or autograd's device threads, which
   inherit the mode stack; a plain Python thread does not, and its FLOPs were never in the total.)
3. **Sharded tensors.** FlopCounterMode sees a DTensor op at its global shape (a tensor-parallel
   matmul counts the whole model's FLOPs on every rank). `RankFlopCounter` lets DTensor dispatch
   such an op itself and counts the ops it runs on the local shards instead, so a count is this
   rank's own work under any sharding: DTensor TP and SP, FSDP2 (its unsharded parameters are
   plain tensors, or DTensors on the tp mesh under FSDP2 + TP), and a pipeline stage (only the
   stage's modules run on the rank; the stage's one-time metadata inference is not counted).

4. **Attention's backward recomputation.** torch's SDPA backward formula
   (`sdpa_backward_flop_count`, used for the CPU op above and by FlopCounterMode's own entries for
   the CUDA flash / memory-efficient / cuDNN SDPA backward ops, ``aten._flash_attention_backward``,
   ``aten._efficient_attention_backward`` and varlen attention's backward) has five matmuls: it
   recomputes the score matrix Q·K^T as the fused kernels do (2*b*H*Tq*Tk*Q per call). The model's
   attention backward has four. `RankFlopCounter` counts the whole formula (the kernels do that
   work) but books the recomputed matmul apart, and `StepFlops` moves it from model FLOPs to
   `recompute_flops` (HFU, never MFU), so counted model FLOPs equal the analytical
   6N + 12*L*H*Q*T per token (docs/definitions.md#which-flops-are-which). Eager ("math")
   attention is plain bmm/matmul ops with four backward matmuls: nothing to move.

How to combine them (the agent's public `checkpoint_context()` wraps this and also opens a
``torch.profiler.record_function("mfuscope::recompute")`` range)::

    counter = RecomputeCounter()

    def context_fn():
        return contextlib.nullcontext(), counter.context()   # (forward ctx, recompute ctx)

    def block_fn(x):
        return checkpoint(block, x, use_reentrant=False, context_fn=context_fn)

    step = count_step_flops(lambda: train_step())   # train_step calls block_fn
    step.model_flops, step.recompute_flops          # recompute excluded from model_flops

Every recompute context that exits while `count_step_flops` is running adds to that step's
`recompute_flops`, whichever `RecomputeCounter` it belongs to; `counter.total_flops` keeps its own
running total across steps. The registry of the running step is process-wide (not a ContextVar)
because on GPU the backward pass, and with it the recomputation, runs on autograd's device
threads. So `count_step_flops` is not reentrant: one step is counted at a time.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from types import TracebackType
from typing import Any

import torch
from mfuscope.agent import _uncounted as uncounted
from torch.utils._python_dispatch import _get_current_dispatch_mode_stack
from torch.utils.flop_counter import (
    FlopCounterMode,
    _FlopCounterMode,
    sdpa_backward_flop_count,
    sdpa_flop_count,
)

__all__ = [
    "RankFlopCounter",
    "RecomputeCounter",
    "StepFlopCount",
    "StepFlops",
    "count_step_flops",
    "cpu_attention_flop_mapping",
    "dispatch_mode_stack",
    "recompute_context_fn",
]


def _sdpa_cpu_forward(
    query_shape: Any, key_shape: Any, value_shape: Any, *args: Any, **kwargs: Any
) -> int:
    # aten._scaled_dot_product_flash_attention_for_cpu(query, key, value, dropout_p, is_causal,
    # *, attn_mask, scale): only the three shapes matter (causal masks are not discounted).
    return int(sdpa_flop_count(query_shape, key_shape, value_shape))


def _sdpa_cpu_backward(
    grad_out_shape: Any,
    query_shape: Any,
    key_shape: Any,
    value_shape: Any,
    *args: Any,
    **kwargs: Any,
) -> int:
    # ..._for_cpu_backward(grad_out, query, key, value, out, logsumexp, dropout_p, is_causal, ...)
    return int(sdpa_backward_flop_count(grad_out_shape, query_shape, key_shape, value_shape))


def cpu_attention_flop_mapping() -> dict[Any, Callable[..., int]]:
    """`custom_mapping` entries for the CPU flash-attention ops FlopCounterMode misses."""
    aten = torch.ops.aten
    return {
        aten._scaled_dot_product_flash_attention_for_cpu: _sdpa_cpu_forward,
        aten._scaled_dot_product_flash_attention_for_cpu_backward: _sdpa_cpu_backward,
    }


def _is_loaded_subclass(kind: type, module_name: str, class_name: str) -> bool:
    # Such a tensor exists only once its module was imported: look the class up there rather than
    # import it (`types` is empty for plain tensors, so this runs only for tensor subclasses).
    base = getattr(sys.modules.get(module_name), class_name, None)
    return isinstance(base, type) and issubclass(kind, base)


def _is_dtensor(kind: type) -> bool:
    return _is_loaded_subclass(kind, "torch.distributed.tensor", "DTensor")


def _is_fake(kind: type) -> bool:
    return _is_loaded_subclass(kind, "torch._subclasses.fake_tensor", "FakeTensor")


class _RankDispatchMode(_FlopCounterMode):  # type: ignore[misc]
    """torch's counting dispatch mode, counting what this rank computes.

    - An op on DTensors is not counted at its global shape: returning NotImplemented hands the
      op to DTensor's own dispatch with this mode still on the stack, so the ops DTensor runs on
      its local shards (and any redistribution) come back here as plain tensors and are counted
      at their local shapes. Nested counters (recompute) do the same, each counting local work.
    - An op on fake tensors computes nothing (DTensor's sharding propagation runs the op on fake
      tensors of the global shape the first time it meets an op and placement): run, not counted.
    """

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        if types:
            if any(_is_dtensor(kind) for kind in types):
                return NotImplemented
            if any(_is_fake(kind) for kind in types):
                return func(*args, **(kwargs or {}))
        return super().__torch_dispatch__(func, types, args, kwargs)


# The attention backward ops whose FlopCounterMode formula is torch's `sdpa_backward_flop_count`
# (five matmuls, the first recomputing Q·K^T), as `str(op packet)` spells them. Each takes
# (grad_out, query, key, value, ...). The varlen entry exists once `torch.nn.attention.varlen`
# has been imported (it registers itself then).
_ATTENTION_BACKWARD_OPS = frozenset(
    {
        "aten._scaled_dot_product_flash_attention_for_cpu_backward",
        "aten._scaled_dot_product_flash_attention_backward",
        "aten._scaled_dot_product_efficient_attention_backward",
        "aten._scaled_dot_product_cudnn_attention_backward",
        "aten._flash_attention_backward",
        "aten._efficient_attention_backward",
        "torch_attn._varlen_attn_backward",
    }
)
# `flop_counts` key under which a counter books attention's backward recomputation.
ATTENTION_RECOMPUTE = "attention_backward_recompute"


def attention_backward_recompute(flops: int, query: Any, value: Any) -> int:
    """The recomputed Q·K^T share of `flops`, the count torch's `sdpa_backward_flop_count` gives
    one attention backward call (FLOPs).

    Per sequence that formula is 2*b*H*Tq*Tk*(3*Dq + 2*Dv): the score recompute (Dq), dP = dO·V^T
    (Dv), dV = P^T·dO (Dv), dQ = dS·K (Dq) and dK = dS^T·Q (Dq). The recompute is 2*b*H*Tq*Tk*Dq,
    i.e. Dq / (3*Dq + 2*Dv) of it; the ratio does not depend on the lengths, so it holds for a
    sum over the sequences of a nested or varlen batch too. Dq and Dv are the last dimensions of
    `query` and `value` (tensors or shapes)."""
    d_q, d_v = int(query.shape[-1]), int(value.shape[-1])
    return flops * d_q // (3 * d_q + 2 * d_v)


class RankFlopCounter(FlopCounterMode):  # type: ignore[misc]
    """`FlopCounterMode` counting this rank's own work (see `_RankDispatchMode`): the local
    shards of DTensor ops, never their global shapes; nothing while `uncounted.paused()` holds
    (a pipeline stage's one-time metadata inference, see `mfuscope.agent._uncounted`). Totals
    only (no per-module table: the module tracker's global hooks are not installed, which also
    keeps counting cheaper).

    `get_total_flops()` is everything the kernels compute; `attention_recompute_flops` is the
    part of it that attention backward kernels spent recomputing scores (see the module
    docstring), booked under `ATTENTION_RECOMPUTE` rather than under the op."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._attention_backward = frozenset(
            op for op in self.flop_registry if str(op) in _ATTENTION_BACKWARD_OPS
        )

    @property
    def attention_backward_ops(self) -> frozenset[Any]:
        """The ops of this counter's registry whose count holds a score recomputation."""
        return self._attention_backward

    @property
    def attention_recompute_flops(self) -> int:
        """FLOPs attention backward kernels spent recomputing the score matrix (hardware work)."""
        return int(self.flop_counts["Global"].get(ATTENTION_RECOMPUTE, 0))

    def __enter__(self) -> RankFlopCounter:
        self.flop_counts.clear()
        mode: Any = _RankDispatchMode(self)
        mode.__enter__()
        self.mode = mode
        return self

    def __exit__(self, *args: Any) -> Any:
        mode: Any = self.mode
        self.mode = None
        if mode is None:
            raise RuntimeError("RankFlopCounter exited without being entered")
        return mode.__exit__(*args)

    def _count_flops(self, func_packet: Any, out: Any, args: Any, kwargs: Any) -> Any:
        if uncounted.paused():
            return out
        if func_packet not in self._attention_backward:
            return super()._count_flops(func_packet, out, args, kwargs)
        # FlopCounterMode's own bookkeeping, with the recomputed matmul booked apart.
        flops = int(self.flop_registry[func_packet](*args, **kwargs, out_val=out))
        recompute = attention_backward_recompute(flops, args[1], args[3])
        for parent in set(self.mod_tracker.parents):
            self.flop_counts[parent][func_packet] += flops - recompute
            self.flop_counts[parent][ATTENTION_RECOMPUTE] += recompute
        return out


def dispatch_mode_stack() -> tuple[int, ...]:
    """The identities of the dispatch modes on this thread's stack, innermost last (empty when
    none is pushed: `FlopsTracker` starts a count at a step's first forward only then)."""
    return tuple(id(mode) for mode in _get_current_dispatch_mode_stack())


def _new_flop_counter() -> RankFlopCounter:
    return RankFlopCounter(display=False, custom_mapping=cpu_attention_flop_mapping())


@dataclass(frozen=True)
class StepFlops:
    """FLOPs of one counted step on this rank: `model_flops` (MFU numerator, recomputation
    excluded) and `recompute_flops` (activation recomputation and attention backward's score
    recomputation; HFU adds it)."""

    model_flops: float
    recompute_flops: float

    @property
    def hardware_flops(self) -> float:
        return self.model_flops + self.recompute_flops


class _StepRegistry:
    """The step being counted, shared by all threads (see the module docstring).

    A recomputation is subtracted from the step's total only if the step's own counter saw it,
    i.e. if that counter's dispatch mode was on the recomputing thread's mode stack. Autograd
    propagates the mode stack to its device threads, so on GPU it is; a plain Python thread that
    recomputes does not inherit it, and its FLOPs were never in the total.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counter: FlopCounterMode | None = None
        self._recompute = 0
        self._recompute_in_total = 0

    def start(self, counter: FlopCounterMode) -> None:
        with self._lock:
            if self._counter is not None:
                raise RuntimeError("count_step_flops is already counting a step (not reentrant)")
            self._counter = counter
            self._recompute = 0
            self._recompute_in_total = 0

    def stop(self) -> tuple[int, int]:
        """End the step: (recompute FLOPs, the part of them the step's total also holds)."""
        with self._lock:
            self._counter = None
            return self._recompute, self._recompute_in_total

    def step_counter_is_active_here(self) -> bool:
        with self._lock:
            counter = self._counter
        if counter is None or counter.mode is None:
            return False
        return any(mode is counter.mode for mode in _get_current_dispatch_mode_stack())

    def add_recompute(self, flops: int, attention_recompute: int, seen_by_step: bool) -> None:
        """A recompute counter's total `flops`, of which `attention_recompute` was attention
        backward's score recomputation. When the step's counter saw these ops, it booked that
        part as attention recompute already: it is added to the step's recompute (and taken out
        of its model FLOPs) once, there."""
        with self._lock:
            if self._counter is not None:
                if seen_by_step:
                    self._recompute += flops - attention_recompute
                    self._recompute_in_total += flops - attention_recompute
                else:
                    self._recompute += flops


_STEP = _StepRegistry()


class _RecomputeContext:
    def __init__(self, owner: RecomputeCounter) -> None:
        self._owner = owner
        self._counter: RankFlopCounter | None = None
        self._seen_by_step = False

    def __enter__(self) -> None:
        self._seen_by_step = _STEP.step_counter_is_active_here()
        self._counter = _new_flop_counter()
        self._counter.__enter__()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        counter, self._counter = self._counter, None
        if counter is None:
            return
        counter.__exit__(exc_type, exc, tb)
        flops = int(counter.get_total_flops())
        self._owner._add(flops)
        _STEP.add_recompute(flops, counter.attention_recompute_flops, self._seen_by_step)


class RecomputeCounter:
    """Counts FLOPs of activation recomputation; use `.context()` as checkpoint's recompute context.

    `total_flops` is the running total over every recomputation seen (FLOPs). Thread-safe: the
    backward pass may run on another thread than the one that created the counter.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._total = 0

    @property
    def total_flops(self) -> int:
        with self._lock:
            return self._total

    def _add(self, flops: int) -> None:
        with self._lock:
            self._total += flops

    def context(self) -> _RecomputeContext:
        """A fresh context manager for one recomputation (checkpoint calls `context_fn` per use)."""
        return _RecomputeContext(self)


def recompute_context_fn(counter: RecomputeCounter) -> Callable[[], tuple[Any, Any]]:
    """A ready `context_fn` for ``checkpoint(..., use_reentrant=False, context_fn=...)``."""
    import contextlib

    def context_fn() -> tuple[Any, Any]:
        return contextlib.nullcontext(), counter.context()

    return context_fn


class StepFlopCount:
    """Count one step between `__enter__` and `__exit__` (for callers that see a step's begin and
    end rather than a function); `count_step_flops` is this around one call.

    Usage: ``with StepFlopCount() as count: ...one step...`` then ``count.result``. Recompute
    contexts that exit inside the block (`recompute_context()` or any `RecomputeCounter`'s) are
    attributed to it. Not reentrant, like `count_step_flops`. The agent's `FlopsTracker` uses
    it as its `CountSession`.
    """

    def __init__(self) -> None:
        self._counter = _new_flop_counter()
        self._recompute = RecomputeCounter()
        self._result: StepFlops | None = None

    def recompute_context(self) -> _RecomputeContext:
        """A fresh context for one recomputation (the agent installs this factory into its
        `checkpoint_context` for the step); any `RecomputeCounter` context would do as well."""
        return self._recompute.context()

    def __enter__(self) -> StepFlopCount:
        uncounted.exclude_pipeline_metadata_inference()
        _STEP.start(self._counter)
        try:
            self._counter.__enter__()
        except BaseException:
            _STEP.stop()
            raise
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        try:
            self._counter.__exit__(exc_type, exc, tb)
        finally:
            recompute, recompute_in_total = _STEP.stop()
        total = int(self._counter.get_total_flops())
        attention = self._counter.attention_recompute_flops
        self._result = StepFlops(
            model_flops=float(total - attention - recompute_in_total),
            recompute_flops=float(recompute + attention),
        )

    @property
    def result(self) -> StepFlops:
        """The counted step; raises RuntimeError before the block has ended."""
        if self._result is None:
            raise RuntimeError("the step has not been counted yet (the block has not ended)")
        return self._result


def count_step_flops(step_fn: Callable[[], object]) -> StepFlops:
    """Run `step_fn` once under FlopCounterMode and return its FLOPs, recomputation apart.

    `step_fn` should be one full training step (forward, backward, optimizer) of this rank. FLOPs
    of recomputation run through a `RecomputeCounter.context()`, and attention backward's score
    recomputation, are reported in `recompute_flops` and are not in `model_flops`.
    """
    with StepFlopCount() as count:
        step_fn()
    return count.result
