"""Activation recomputation, made visible: a `context_fn` for `torch.utils.checkpoint`.

`checkpoint_context()` returns the pair of context managers `torch.utils.checkpoint.checkpoint(...,
use_reentrant=False, context_fn=checkpoint_context)` expects: nothing around the original forward,
and around the recomputation in backward

- a `mfuscope::recompute` profiler range, by which the engine tells recompute kernels from
  compute (docs/definitions.md#compute-and-recompute), entered only while a profiler is
  recording; and
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


def _recompute_managers() -> list[contextlib.AbstractContextManager[Any]]:
    """What to enter around one recomputation now: the profiler range if a profiler records,
    the step's FLOP counter if one is installed."""
    import torch.autograd.profiler as autograd_profiler

    managers: list[contextlib.AbstractContextManager[Any]] = []
    # `_is_profiler_enabled` is torch's own fast Python-side check (torch >= 1.13).
    if getattr(autograd_profiler, "_is_profiler_enabled", True):
        managers.append(autograd_profiler.record_function(RECOMPUTE_RANGE))
    counter = _recompute_counter
    if counter is not None:
        managers.append(counter())
    return managers


class _RecomputeContext:
    """Entered around one recomputation by `torch.utils.checkpoint`: enters our managers (chosen
    at entry), then the caller's own recompute context if any; exits them in reverse order."""

    def __init__(self, user: contextlib.AbstractContextManager[Any] | None = None) -> None:
        self._user = user
        self._stack: contextlib.ExitStack | None = None

    def __enter__(self) -> _RecomputeContext:
        stack = contextlib.ExitStack()
        try:
            for manager in _recompute_managers():
                stack.enter_context(manager)
            if self._user is not None:
                stack.enter_context(self._user)
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


_ContextPair = tuple[contextlib.AbstractContextManager[Any], contextlib.AbstractContextManager[Any]]


def checkpoint_context() -> _ContextPair:
    """`context_fn` for `torch.utils.checkpoint.checkpoint(..., use_reentrant=False)`.

    Returns ``(forward_context, recompute_context)``; see the module docstring.
    """
    return contextlib.nullcontext(), _RecomputeContext()


def _composed(user_fn: Callable[[], _ContextPair]) -> Callable[[], _ContextPair]:
    def context_fn() -> _ContextPair:
        user_forward, user_recompute = user_fn()
        return user_forward, _RecomputeContext(user_recompute)

    return context_fn


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
