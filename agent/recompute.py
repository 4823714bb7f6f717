"""Activation recomputation, made visible: a `context_fn` for `torch.utils.checkpoint`.

`checkpoint_context()` returns the pair of context managers `torch.utils.checkpoint.checkpoint(...,
use_reentrant=False, context_fn=checkpoint_context)` expects: nothing around the original forward,
and around the recomputation in backward

- a `mfuscope::recompute` profiler range, by which the engine tells recompute kernels from
  compute (DESIGN §2, bucket 2), entered only while a profiler is recording; and
- the agent's recompute FLOP counter while the agent is counting a step, so recomputation FLOPs
  go to HFU and never to MFU.

`wrap_checkpoint()` patches `torch.utils.checkpoint.checkpoint` so every non-reentrant call gets
this context (composed with the caller's own `context_fn`, if any). Code that bound the function
before the patch (`from torch.utils.checkpoint import checkpoint` at import time) keeps the
original: create the Agent before importing the model code, or pass `context_fn` yourself.
Reentrant checkpointing cannot take a `context_fn`; the engine still finds its recomputation
through `CheckpointFunctionBackward`, but its FLOPs are not counted separately.
"""

from __future__ import annotations

import contextlib
import functools
import threading
from collections.abc import Callable
from types import TracebackType
from typing import Any

__all__ = [
    "RECOMPUTE_RANGE",
    "checkpoint_context",
    "set_recompute_counter",
    "wrap_checkpoint",
]

RECOMPUTE_RANGE = "mfuscope::recompute"

# The recompute counter of the step being counted, if any. A process-wide slot rather than a
# thread-local: on GPU the autograd engine runs backward (and so recomputation) on its own
# device threads.
_counter_lock = threading.Lock()
_recompute_counter: Callable[[], contextlib.AbstractContextManager[Any]] | None = None


def set_recompute_counter(
    factory: Callable[[], contextlib.AbstractContextManager[Any]] | None,
) -> None:
    """Install (or clear, with None) the context entered around every recomputation."""
    global _recompute_counter
    with _counter_lock:
        _recompute_counter = factory


class _RecomputeContext:
    """Entered around one recomputation by `torch.utils.checkpoint`."""

    def __init__(self) -> None:
        self._stack: contextlib.ExitStack | None = None

    def __enter__(self) -> _RecomputeContext:
        import torch.autograd.profiler as autograd_profiler

        stack = contextlib.ExitStack()
        try:
            # `_is_profiler_enabled` is torch's own fast Python-side check (torch >= 1.13).
            if getattr(autograd_profiler, "_is_profiler_enabled", True):
                stack.enter_context(autograd_profiler.record_function(RECOMPUTE_RANGE))
            counter = _recompute_counter
            if counter is not None:
                stack.enter_context(counter())
        except BaseException:
            stack.close()
            raise
        self._stack = stack
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> bool:
        stack, self._stack = self._stack, None
        if stack is not None:
            return bool(stack.__exit__(exc_type, exc, traceback))
        return False


def checkpoint_context() -> tuple[
    contextlib.AbstractContextManager[Any], contextlib.AbstractContextManager[Any]
]:
    """`context_fn` for `torch.utils.checkpoint.checkpoint(..., use_reentrant=False)`.

    Returns ``(forward_context, recompute_context)``; see the module docstring.
    """
    return contextlib.nullcontext(), _RecomputeContext()


def _composed(
    user_fn: Callable[
        [], tuple[contextlib.AbstractContextManager[Any], contextlib.AbstractContextManager[Any]]
    ],
) -> Callable[
    [], tuple[contextlib.AbstractContextManager[Any], contextlib.AbstractContextManager[Any]]
]:
    def context_fn() -> tuple[
        contextlib.AbstractContextManager[Any], contextlib.AbstractContextManager[Any]
    ]:
        user_forward, user_recompute = user_fn()
        return user_forward, _Both(_RecomputeContext(), user_recompute)

    return context_fn


class _Both:
    """Enter `outer` then `inner`; exit in reverse order."""

    def __init__(
        self,
        outer: contextlib.AbstractContextManager[Any],
        inner: contextlib.AbstractContextManager[Any],
    ) -> None:
        self._managers = (outer, inner)
        self._stack: contextlib.ExitStack | None = None

    def __enter__(self) -> _Both:
        stack = contextlib.ExitStack()
        try:
            for manager in self._managers:
                stack.enter_context(manager)
        except BaseException:
            stack.close()
            raise
        self._stack = stack
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> bool:
        stack, self._stack = self._stack, None
        return bool(stack.__exit__(exc_type, exc, traceback)) if stack is not None else False


def wrap_checkpoint() -> Callable[[], None]:
    """Patch `torch.utils.checkpoint.checkpoint` to add `checkpoint_context` to non-reentrant
    calls. Returns a function that restores the original. Idempotent: a second call while the
    patch is in place changes nothing and returns a no-op.
    """
    import torch.utils.checkpoint as checkpoint_module

    original = checkpoint_module.checkpoint
    if getattr(original, "_mfuscope_wrapped", False):
        return lambda: None
    noop = checkpoint_module.noop_context_fn

    @functools.wraps(original)
    def checkpoint(
        function: Any,
        *args: Any,
        use_reentrant: bool | None = None,
        context_fn: Any = noop,
        **kwargs: Any,
    ) -> Any:
        if use_reentrant is False:
            context_fn = checkpoint_context if context_fn is noop else _composed(context_fn)
        return original(
            function, *args, use_reentrant=use_reentrant, context_fn=context_fn, **kwargs
        )

    checkpoint._mfuscope_wrapped = True  # type: ignore[attr-defined]
    checkpoint_module.checkpoint = checkpoint

    def unwrap() -> None:
        if checkpoint_module.checkpoint is checkpoint:
            checkpoint_module.checkpoint = original

    return unwrap
