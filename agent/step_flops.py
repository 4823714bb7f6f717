"""Which model and recompute FLOPs each step's report carries, counted as rarely as possible.

The agent's FLOPs come from two places: this module decides, per step, between FLOPs the user gave
and FLOPs counted on a real step (`counted_flops`, torch's FlopCounterMode). The analytical
formulas of `mfuscope calc` (`mfuscope.core.flops`) are never used in a running job.

Given FLOPs (`flops_per_step`) are used as they are. Otherwise the first step is run under a
FLOP counter (entered when the step begins, left when it ends, so the step is not run twice) and
the count is reused. With a model, a forward pre-hook notes the input shapes of every forward in
a step (a tuple of shapes, cheap); a step whose shapes were never counted makes the *next* step
a counting step (its shapes are likely the new ones), and each distinct shape signature is
counted once, up to `max_recounts` signatures. A step with uncounted shapes carries the latest
count. Counting costs one slow step (FlopCounterMode dispatches every op through Python).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from mfuscope.agent._health import RateLimitedLog
from mfuscope.agent.recompute import set_recompute_counter

__all__ = ["CountSession", "FlopsTracker", "StepFlopsValue", "input_signature"]

# Signatures are kept short: a step with more forwards than this is identified by its first ones.
_MAX_FORWARDS_PER_SIGNATURE = 32
MAX_COUNT_FAILURES = 3

Signature = tuple[tuple[tuple[int, ...], ...], ...]


@dataclass(frozen=True)
class StepFlopsValue:
    """This rank's FLOPs for one step and where they came from (`given`, `counted`, `stale`,
    `unknown`)."""

    model_flops: float
    recompute_flops: float
    source: str


class CountedFlops(Protocol):
    @property
    def model_flops(self) -> float: ...
    @property
    def recompute_flops(self) -> float: ...


class CountSession(Protocol):
    """One counting step: entered at step begin, left at step end
    (`mfuscope.agent.counted_flops.StepFlopCount` in production).

    `recompute_context()` gives a context manager that counts recomputation separately (it is
    installed into `checkpoint_context` while the session runs); `result` gives the step's
    `model_flops` (recomputation excluded) and `recompute_flops` after exit.
    """

    def __enter__(self) -> Any: ...

    def __exit__(self, *exc: Any) -> Any: ...

    def recompute_context(self) -> contextlib.AbstractContextManager[Any]: ...

    @property
    def result(self) -> CountedFlops: ...


def input_signature(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[tuple[int, ...], ...]:
    """Shapes of the tensor arguments of one forward call (non-tensors are ignored)."""
    shapes = []
    for value in (*args, *kwargs.values()):
        shape = getattr(value, "shape", None)
        if shape is not None:
            shapes.append(tuple(int(d) for d in shape))
    return tuple(shapes)


class FlopsTracker:
    """Gives each step its FLOPs; see the module docstring for when it counts."""

    def __init__(
        self,
        *,
        given: tuple[float, float] | None,
        new_session: Callable[[], CountSession] | None,
        log: RateLimitedLog,
        model: Any = None,
        max_recounts: int = 8,
    ) -> None:
        self._given = None if given is None else StepFlopsValue(*given, "given")
        self._new_session = new_session
        self._log = log
        self._max_recounts = max_recounts
        self._counts: dict[Signature, StepFlopsValue] = {}  # source "counted"
        self._latest: StepFlopsValue | None = None
        self._count_next = given is None and new_session is not None
        self._session: CountSession | None = None
        self._count_failures = 0
        self._forwards: list[tuple[tuple[int, ...], ...]] = []
        self._hook: Any = None
        if given is None and model is not None and hasattr(model, "register_forward_pre_hook"):
            self._hook = model.register_forward_pre_hook(self._pre_forward, with_kwargs=True)

    @property
    def counting(self) -> bool:
        """Whether the current (or next) step is a counting step."""
        return self._session is not None or self._count_next

    def _pre_forward(self, module: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        if len(self._forwards) < _MAX_FORWARDS_PER_SIGNATURE:
            try:
                self._forwards.append(input_signature(args, kwargs))
            except Exception:
                self._forwards.append(())

    def begin_step(self, *, allow_count: bool = True) -> None:
        """Start a step; a pending count waits for a step where `allow_count` holds."""
        if self._forwards:
            self._forwards = []
        if not self._count_next or self._new_session is None or not allow_count:
            return
        self._count_next = False
        session = self._new_session()
        session.__enter__()
        self._session = session
        set_recompute_counter(session.recompute_context)

    def end_step(self, *, failed: bool = False) -> StepFlopsValue:
        """FLOPs of the step that just ended. `failed`: the step raised (counts are not kept)."""
        if self._given is not None:
            return self._given  # never counts, never watches shapes: nothing else to do
        signature: Signature = tuple(self._forwards)
        session, self._session = self._session, None
        if session is not None:
            set_recompute_counter(None)
            session.__exit__(None, None, None)
            if not failed:
                counted = session.result
                value = StepFlopsValue(counted.model_flops, counted.recompute_flops, "counted")
                self._counts[signature] = self._latest = value
                return value
        known = self._counts.get(signature)
        if known is not None:
            self._latest = known
            return known
        if self._latest is None:
            # Not counted yet (the counting step raised): try again on the next step.
            self._count_next = self._new_session is not None
            return StepFlopsValue(0.0, 0.0, "unknown")
        if len(self._counts) < self._max_recounts and self._new_session is not None:
            self._count_next = True
        else:
            self._log.warning(
                "flops-recount-limit",
                "mfuscope: input shapes changed again after %d counted shape sets; reusing the "
                "latest FLOP count (pass flops_per_step for exact MFU on variable shapes)",
                len(self._counts),
            )
        return StepFlopsValue(self._latest.model_flops, self._latest.recompute_flops, "stale")

    def abort(self) -> None:
        """Leave a counting session after the counter itself failed; never raises.

        After `MAX_COUNT_FAILURES` such failures counting is given up (FLOPs stay unknown).
        """
        self._count_failures += 1
        self._count_next = (
            self._latest is None
            and self._new_session is not None
            and self._count_failures < MAX_COUNT_FAILURES
        )
        session, self._session = self._session, None
        set_recompute_counter(None)
        if session is not None:
            with contextlib.suppress(Exception):
                session.__exit__(None, None, None)

    def close(self) -> None:
        session, self._session = self._session, None
        set_recompute_counter(None)
        if session is not None:
            with contextlib.suppress(Exception):
                session.__exit__(None, None, None)
        if self._hook is not None:
            with contextlib.suppress(Exception):
                self._hook.remove()
            self._hook = None
