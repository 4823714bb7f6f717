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

Steps whose shapes did not change cost no bookkeeping at step end. The forward pre-hook compares
each forward's shapes with the *steady* signature (the latest counted or known one) as it runs,
and keeps the count of forwards that matched in `ForwardMatch.forwards_matched`; a step whose
count equals `ForwardMatch.steady_forwards` has the steady signature, and the agent's step
recorder gives it the steady FLOPs without calling `end_step` (`mfuscope.agent._step_recorder`).
Only a step that diverges keeps a list of its forwards. A count may start at a step's first
forward only while no dispatch mode is pushed (`mode_stack()` empty): a mode on the stack may have
been pushed inside the step, and the counter, itself a dispatch mode, must leave the stack in the
order it entered; such a step carries the latest count and the next step is counted from its
beginning.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from mfuscope.agent import _uncounted as uncounted
from mfuscope.agent._health import RateLimitedLog
from mfuscope.agent._recompute import set_recompute_counter

__all__ = [
    "CountSession",
    "FlopsTracker",
    "ForwardCounts",
    "ForwardMatch",
    "StepFlopsValue",
    "input_signature",
]

# Signatures are kept short: a step with more forwards than this is identified by its first ones.
_MAX_FORWARDS_PER_SIGNATURE = 32
MAX_COUNT_FAILURES = 3

Signature = tuple[tuple[tuple[int, ...], ...], ...]
Forward = tuple[tuple[int, ...], ...]

# `ForwardMatch.forwards_matched` outside the steady check: the step records every forward in a
# list (a step begun by `begin_step`, or one that diverged), or no step runs.
RECORDING = -1
OUTSIDE = -2
# `ForwardMatch.steady_forwards` while no signature is steady (nothing counted yet): no count of
# matched forwards equals it.
NO_STEADY = -3


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
    (`mfuscope.agent._counted_flops.StepFlopCount` in production).

    `recompute_context()` gives a context manager that counts recomputation separately (it is
    installed into `checkpoint_context` while the session runs); `result` gives the step's
    `model_flops` (recomputation excluded) and `recompute_flops` after exit.
    """

    def __enter__(self) -> Any: ...

    def __exit__(self, *exc: Any) -> Any: ...

    def recompute_context(self) -> contextlib.AbstractContextManager[Any]: ...

    @property
    def result(self) -> CountedFlops: ...


_UNKNOWN = StepFlopsValue(0.0, 0.0, "unknown")


class ForwardCounts(Protocol):
    """What the forward pre-hook and the step recorder share (a `ForwardMatch`, or the agent's
    step recorder, which holds them in its slots)."""

    forwards_matched: int
    steady_forwards: int


class ForwardMatch:
    """The per-step state of the steady-shape check, shared by the forward pre-hook (which
    writes `forwards_matched`) and the agent's step recorder (which resets it at step begin and
    compares it with `steady_forwards` at step end). Plain int slots: read and written by the
    training thread only."""

    __slots__ = ("forwards_matched", "steady_forwards")

    def __init__(self) -> None:
        self.forwards_matched = OUTSIDE
        self.steady_forwards = NO_STEADY


def input_signature(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Forward:
    """Shapes of the tensor arguments of one forward call (non-tensors are ignored)."""
    shapes: list[tuple[int, ...]] = []
    for value in (*args, *kwargs.values()) if kwargs else args:
        shape = getattr(value, "shape", None)
        if shape is not None:
            # torch.Size is a tuple of ints already (hashable, equal to the plain tuple)
            shapes.append(shape if isinstance(shape, tuple) else tuple(int(d) for d in shape))
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
        match: ForwardCounts | None = None,
    ) -> None:
        """`mode_stack()` returns the dispatch modes on the stack, falsy when there are none
        (`counted_flops.dispatch_mode_stack` in production); `may_count_now()` says whether a
        count may start now (not while a profiled window records). `match`: the per-step state
        shared with the agent's step recorder (a fresh one when None)."""
        self.match = match if match is not None else ForwardMatch()
        self._given = None if given is None else StepFlopsValue(*given, "given")
        self._new_session = new_session
        self._log = log
        self._max_recounts = max_recounts
        self._counts: dict[Signature, StepFlopsValue] = {}  # source "counted"
        self._first_forwards: set[Forward] = set()  # the first forward of each counted signature
        self._latest: StepFlopsValue | None = None
        self._count_next = given is None and new_session is not None
        self._session: CountSession | None = None
        self._count_failures = 0
        # The steady signature's forwards and FLOPs (see the module docstring).
        self._steady: Signature = ()
        self.steady_value: StepFlopsValue | None = None
        # The forwards of a step that records them all (RECORDING).
        self._forwards: list[Forward] = []
        # Whether a count may start at this step's first forward: set by `begin_step`; a step the
        # recorder began itself (no call to `begin_step`) may, when its first forward is new.
        self._first_forward_may_count = False
        self._mode_stack = mode_stack
        self._may_count_now = may_count_now
        self._hook: Any = None
        if self._given is not None:
            self._set_steady((), self._given)  # never counts, never watches shapes
        elif new_session is None:
            self._set_steady((), _UNKNOWN)  # nothing to count with: FLOPs stay unknown
        elif model is not None and hasattr(model, "register_forward_pre_hook"):
            self._hook = model.register_forward_pre_hook(self._pre_forward, with_kwargs=True)

    @property
    def counting(self) -> bool:
        """Whether the current (or next) step is a counting step."""
        return self._session is not None or self._count_next

    def _set_steady(self, signature: Signature, value: StepFlopsValue) -> None:
        self._steady = signature
        self.steady_value = value
        self.match.steady_forwards = len(signature)

    def _pre_forward(self, module: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        match = self.match
        matched = match.forwards_matched
        if matched == OUTSIDE or uncounted.paused():
            # Outside a step, or a pipeline stage's one-time metadata pass: not a forward of the
            # step's own (in the signature it would make the first step's shapes differ from
            # every later one).
            return
        if matched >= _MAX_FORWARDS_PER_SIGNATURE:
            return
        try:
            forward = input_signature(args, kwargs)
        except Exception:
            forward = ()
        if matched >= 0:
            steady = self._steady
            if matched < len(steady) and forward == steady[matched]:
                match.forwards_matched = matched + 1
                return
            # Diverged: from here on keep every forward (the ones so far were the steady ones).
            match.forwards_matched = RECORDING
            self._forwards = [*steady[:matched], forward]
            if matched == 0 and self._may_recount():
                self._count_from_first_forward(forward)
            return
        forwards = self._forwards
        if len(forwards) >= _MAX_FORWARDS_PER_SIGNATURE:
            return
        forwards.append(forward)
        if len(forwards) == 1 and self._first_forward_may_count:
            self._first_forward_may_count = False  # decided at the first forward only
            self._count_from_first_forward(forward)

    def _may_recount(self) -> bool:
        return (
            self._new_session is not None
            and self._hook is not None
            and bool(self._counts)
            and len(self._counts) < self._max_recounts
        )

    def _count_from_first_forward(self, first: Forward) -> None:
        """Start counting at this step's first forward when its shapes are new and a count may
        start here; never raises into the model's forward."""
        try:
            if (
                first not in self._first_forwards
                and self._session is None
                and self._may_count_now()
                and not self._mode_stack()
            ):
                self._start_session()
        except Exception as exc:
            self._log.warning(
                "flops-count-start", "mfuscope: could not start counting FLOPs: %r", exc
            )
            self.abort()

    def _start_session(self) -> None:
        assert self._new_session is not None
        session = self._new_session()
        session.__enter__()
        self._session = session
        self.match.forwards_matched = RECORDING  # a counted step ends through `end_step`
        set_recompute_counter(session.recompute_context)

    def begin_step(self, *, allow_count: bool = True) -> None:
        """Start a step that records every forward (the agent's recorder begins a steady step
        without this call); a pending count waits for a step where `allow_count` holds."""
        self.match.forwards_matched = RECORDING
        if self._forwards:
            self._forwards = []
        self._first_forward_may_count = False
        if self._new_session is None or not allow_count:
            return
        if self._count_next:
            self._count_next = False
            self._start_session()
        elif self._may_recount():
            self._first_forward_may_count = True

    def end_step(
        self, *, failed: bool = False, given: StepFlopsValue | None = None
    ) -> StepFlopsValue:
        """FLOPs of the step that just ended. `failed`: the step raised (counts are not kept).
        `given`: FLOPs given for this very step (begun with `allow_count=False`), returned as
        they are; the step's shapes are not counted later on its account."""
        match = self.match
        matched = match.forwards_matched
        match.forwards_matched = OUTSIDE
        self._first_forward_may_count = False
        if matched >= 0:
            signature: Signature = self._steady[:matched]
        else:
            signature = tuple(self._forwards)
        if self._forwards:
            self._forwards = []
        if given is not None:
            return given
        if self._given is not None:
            return self._given  # never counts, never watches shapes: nothing else to do
        session, self._session = self._session, None
        if session is not None:
            set_recompute_counter(None)
            session.__exit__(None, None, None)
            if not failed:
                counted = session.result
                value = StepFlopsValue(counted.model_flops, counted.recompute_flops, "counted")
                self._counts[signature] = self._latest = value
                if signature:
                    self._first_forwards.add(signature[0])
                self._set_steady(signature, value)
                return value
        known = self._counts.get(signature)
        if known is not None:
            self._latest = known
            self._set_steady(signature, known)
            return known
        if self._latest is None:
            # Not counted yet (the counting step raised): try again on the next step.
            self._count_next = self._new_session is not None
            return _UNKNOWN
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
        self._first_forward_may_count = False
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
