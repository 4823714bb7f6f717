"""Which model and recompute FLOPs each step's report carries, counted as rarely as possible.

The agent's FLOPs come from three places, in this order of precedence: FLOPs given for one step
(`agent.step(flops=...)`), FLOPs given for every step (`flops_per_step`), and FLOPs counted on a
real step (`counted_flops`, torch's FlopCounterMode, this rank's own work under any sharding).
The analytical formulas of `mfuscope calc` (`mfuscope.core.flops`) are never used in a running
job.

Counting runs a step under a FLOP counter (entered while the step runs, so the step is not run
twice) and keeps the count for the step's *shape signature*: the input shapes of every forward of
the model in the step (a forward pre-hook notes them; a tuple of shapes, cheap). The first step
is counted from its beginning. Later, a step whose first forward has shapes no counted step began
with is counted from that forward on: it gets its own count, not another step's (nothing before
the first forward, such as data loading or `zero_grad`, does model FLOPs). Each signature is
counted once, up to `max_recounts` signatures; a step whose shapes diverge only after its first
forward, or that comes after the limit, carries the latest count (`stale`), and in the first
case the next step is counted from its beginning. Without a model no shapes are seen and the
first count is reused. Counting costs one slow step (FlopCounterMode dispatches every op through
Python).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from mfuscope.agent import uncounted
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
        mode_stack: Callable[[], object] = tuple,
        may_count_now: Callable[[], bool] = lambda: True,
    ) -> None:
        """`mode_stack()` returns something that compares equal while the dispatch-mode stack is
        unchanged (`counted_flops.dispatch_mode_stack` in production); `may_count_now()` says
        whether a count may start now (not while a profiled window records)."""
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
        # A step may start counting at its first forward (see the module docstring) only when
        # counting is allowed now and nothing else pushed a dispatch mode since the step began:
        # the counter is a dispatch mode and must leave the mode stack in the order it entered.
        self._count_at_first_forward = False
        self._modes_at_begin: object = None
        self._mode_stack = mode_stack
        self._may_count_now = may_count_now
        self._hook: Any = None
        if given is None and model is not None and hasattr(model, "register_forward_pre_hook"):
            self._hook = model.register_forward_pre_hook(self._pre_forward, with_kwargs=True)

    @property
    def counting(self) -> bool:
        """Whether the current (or next) step is a counting step."""
        return self._session is not None or self._count_next

    def _pre_forward(self, module: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        if uncounted.paused():
            # A pipeline stage's one-time metadata pass is not a forward of the step's own:
            # in the signature it would make the first step's shapes differ from every later one.
            return
        if len(self._forwards) < _MAX_FORWARDS_PER_SIGNATURE:
            try:
                self._forwards.append(input_signature(args, kwargs))
            except Exception:
                self._forwards.append(())
        if self._count_at_first_forward:
            self._count_at_first_forward = False  # decided at the first forward only
            try:
                if self._first_forward_is_new() and self._may_start_count_here():
                    self._start_session()
            except Exception as exc:  # never raise into the model's forward
                self._log.warning(
                    "flops-count-start", "mfuscope: could not start counting FLOPs: %r", exc
                )
                self.abort()

    def _first_forward_is_new(self) -> bool:
        first = self._forwards[0]
        return not any(signature[:1] == (first,) for signature in self._counts)

    def _may_start_count_here(self) -> bool:
        return (
            self._session is None
            and self._may_count_now()
            and self._mode_stack() == self._modes_at_begin
        )

    def _start_session(self) -> None:
        assert self._new_session is not None
        session = self._new_session()
        session.__enter__()
        self._session = session
        set_recompute_counter(session.recompute_context)

    def begin_step(self, *, allow_count: bool = True) -> None:
        """Start a step; a pending count waits for a step where `allow_count` holds."""
        if self._forwards:
            self._forwards = []
        self._count_at_first_forward = False
        if self._new_session is None or not allow_count:
            return
        if self._count_next:
            self._count_next = False
            self._start_session()
        elif self._hook is not None and self._counts and len(self._counts) < self._max_recounts:
            self._count_at_first_forward = True
            self._modes_at_begin = self._mode_stack()

    def end_step(
        self, *, failed: bool = False, given: StepFlopsValue | None = None
    ) -> StepFlopsValue:
        """FLOPs of the step that just ended. `failed`: the step raised (counts are not kept).
        `given`: FLOPs given for this very step (begun with `allow_count=False`), returned as
        they are; the step's shapes are not counted later on its account."""
        self._count_at_first_forward = False
        if given is not None:
            return given
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
                "latest FLOP count (pass agent.step(flops=...) for exact MFU on variable shapes)",
                len(self._counts),
            )
        return StepFlopsValue(self._latest.model_flops, self._latest.recompute_flops, "stale")

    def abort(self) -> None:
        """Leave a counting session after the counter itself failed; never raises.

        After `MAX_COUNT_FAILURES` such failures counting is given up (FLOPs stay unknown).
        """
        self._count_at_first_forward = False
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
