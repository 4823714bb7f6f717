"""Work a training step does that is not model work, kept out of the counted FLOPs.

A `torch.distributed.pipelining` schedule initialises its stages on its first `step()`: each
stage runs a forward (and, when training, a backward) of one micro-batch on empty tensors to learn
the shapes it will send and receive. That is real compute, but it trains nothing and happens
once; counted, it would inflate the first step's count (and every later step that reuses it) by
one micro-batch. `exclude_pipeline_metadata_inference()` wraps the stage's two preparation
methods so that they run with counting paused.

The pause is process-wide, not per thread: on GPU the backward of the metadata pass runs on
autograd's device threads. The preparation runs synchronously inside the schedule's `step()`, so
nothing else of this rank's step runs while it is paused.
"""

from __future__ import annotations

import contextlib
import functools
import sys
import threading
from collections.abc import Callable, Iterator
from typing import Any

__all__ = ["exclude_pipeline_metadata_inference", "pause", "paused"]

_lock = threading.Lock()
_depth = 0
_WRAPPED_MARK = "_mfuscope_uncounted"
# torch.distributed.pipelining (torch 2.13): the methods that run the metadata inference.
_PIPELINE_PREPARATION = ("_prepare_forward_infra", "_prepare_backward_infra")


def paused() -> bool:
    """Whether counting is paused now (checked for every counted op, so kept cheap)."""
    return _depth > 0


@contextlib.contextmanager
def pause() -> Iterator[None]:
    """Ops run inside are not counted by any of the agent's FLOP counters."""
    global _depth
    with _lock:
        _depth += 1
    try:
        yield
    finally:
        with _lock:
            _depth -= 1


def _paused_method(method: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(method)
    def run_uncounted(*args: Any, **kwargs: Any) -> Any:
        with pause():
            return method(*args, **kwargs)

    setattr(run_uncounted, _WRAPPED_MARK, True)
    return run_uncounted


def exclude_pipeline_metadata_inference() -> bool:
    """Wrap the pipeline stages' preparation methods (once per process) so their metadata
    inference is not counted. Does nothing unless the job imported `torch.distributed.pipelining`
    (it is never imported here); returns whether the methods are wrapped now."""
    stage_module = sys.modules.get("torch.distributed.pipelining.stage")
    if stage_module is None:
        return False
    wrapped = False
    for name in dir(stage_module):
        kind = getattr(stage_module, name)
        if not isinstance(kind, type):
            continue
        for method_name in _PIPELINE_PREPARATION:
            method = kind.__dict__.get(method_name)
            if method is None:
                continue
            if not getattr(method, _WRAPPED_MARK, False):
                setattr(kind, method_name, _paused_method(method))
            wrapped = True
    return wrapped
