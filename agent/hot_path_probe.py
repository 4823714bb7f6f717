"""What a steady step boundary runs on the training thread, and what it costs against the floor.

One probe for the hot-path contract (`_step_recorder`'s docstring): the contract tests run it on
CPU (and on the device path with fake CUDA calls), `mfuscope validate-gpu` on a real GPU, and
`benchmarks/agent_overhead_single.py` times it.

- `boundary_calls(agent, work)` takes steps until they are steady, then lists with
  `sys.setprofile` the Python functions (``call``) and builtins (``c_call``) that one steady
  `with agent.step():` (entering, then leaving) and one steady `agent.mark_step()` run on this
  thread. A builtin called through a C `functools.partial` (the thread clock's `pread`, CUDA's
  current-stream handle) shows no call of its own.
- `boundary_costs(work, ...)` times, per step, the time spent inside the instrumentation (entering
  and leaving the `with` block, or the one `mark_step()` call) of a floor, `with agent.step():`
  and `agent.mark_step()`, in blocks interleaved in a rotating order so drift hits all three
  alike. Each agent's first step (the slow path: FLOPs counted) is left out. The floor is the
  least any per-step instrumentation can do: `Floor`, one timestamp appended to a list; on a
  GPU, `DeviceFloor`, which also records one CUDA event at each of its two boundaries, through
  the same calls as the agent (a step timer on the device cannot record fewer).

Nothing here runs in a training job; it is the agent's own measuring stick.
"""

from __future__ import annotations

import statistics
import sys
import time
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass
from types import FrameType, TracebackType
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from mfuscope.agent.step_timer import DeviceCalls

__all__ = [
    "BoundaryCalls",
    "BoundaryCosts",
    "Call",
    "DeviceFloor",
    "Floor",
    "boundary_calls",
    "boundary_costs",
    "profiled",
    "quantile",
]

Call = tuple[str, str]  # ("call", Python function name) or ("c_call", builtin name)


def profiled(action: Callable[[], object], *, opaque: str | None = None) -> list[Call]:
    """The Python functions and builtins `action()` runs on this thread (`action` itself and
    the profiler's own `setprofile` left out). `opaque`: a source file whose functions stand in
    for C code (test fakes of CUDA calls): they are listed, what they call is not."""
    seen: list[Call] = []

    def note(frame: FrameType, event: str, arg: Any) -> None:
        if event == "call":
            caller = frame.f_back
            if caller is None or caller.f_code.co_filename != opaque:
                seen.append(("call", frame.f_code.co_name))
        elif event == "c_call" and frame.f_code.co_filename != opaque:
            seen.append(("c_call", getattr(arg, "__name__", repr(arg))))

    sys.setprofile(note)
    try:
        action()
    finally:
        sys.setprofile(None)
    return [entry for entry in seen[1:] if entry[1] != "setprofile"]  # [0]: `action` itself


@dataclass(frozen=True)
class BoundaryCalls:
    """What one steady boundary ran: entering `with agent.step():` (`agent.step()` and
    `__enter__`), leaving it (`__exit__`), and one `agent.mark_step()`."""

    entering: tuple[Call, ...]
    leaving: tuple[Call, ...]
    marking: tuple[Call, ...]


def boundary_calls(
    agent: Any,
    work: Callable[[], object],
    *,
    warm_steps: int = 3,
    opaque: str | None = None,
    settle: Callable[[], object] = lambda: None,
) -> BoundaryCalls:
    """Steady steps of `agent` around `work()`, then one of each boundary profiled (the step's
    work itself is not; `opaque` as for `profiled`; `settle()` runs before each profiled
    boundary). Leaves a marked step open: `agent.close()` ends it."""
    for _ in range(warm_steps):  # the first step counts FLOPs; then the shapes are steady
        with agent.step():
            work()
    scope: Any = None

    def enter() -> None:
        nonlocal scope
        scope = agent.step()
        scope.__enter__()

    settle()
    entering = profiled(enter, opaque=opaque)
    work()
    leaving = profiled(lambda: scope.__exit__(None, None, None), opaque=opaque)
    for _ in range(warm_steps):  # the first mark after a `with` step ends nothing
        agent.mark_step()
        work()
    settle()  # inside the marked step, before the boundary that ends it
    marking = profiled(lambda: agent.mark_step(), opaque=opaque)
    work()
    return BoundaryCalls(tuple(entering), tuple(leaving), tuple(marking))


class Floor:
    """The least a per-step instrumentation can do: one timestamp, appended to a list."""

    def __init__(self) -> None:
        self.stamps: list[int] = []

    def __enter__(self) -> Floor:
        self.stamps.append(time.perf_counter_ns())
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        return None


class DeviceFloor:
    """The least a step timer on a GPU can do: `Floor`'s timestamp, and one event recorded at
    each boundary (two events, reused, on a stream fetched once; `calls`: the agent's
    `step_timer.DeviceCalls`)."""

    def __init__(self, calls: DeviceCalls) -> None:
        self.stamps: list[int] = []
        self._record = calls.record
        self._stream = calls.stream()
        self._start, self._end = calls.new_event(), calls.new_event()

    def __enter__(self) -> DeviceFloor:
        self.stamps.append(time.perf_counter_ns())
        self._record(self._start, self._stream)
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self._record(self._end, self._stream)


def quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(int(q * len(ordered)), len(ordered) - 1)]


@dataclass(frozen=True)
class BoundaryCosts:
    """Seconds spent inside the instrumentation per step, per mode: each floor by its name,
    ``step`` (`with agent.step():`) and ``mark`` (`agent.mark_step()`)."""

    seconds: Mapping[str, tuple[float, ...]]

    def of(self, mode: str) -> tuple[float, ...]:
        """The mode's seconds per step."""
        return self.seconds[mode]

    def median_s(self, mode: str) -> float:
        return statistics.median(self.of(mode))

    def p99_s(self, mode: str) -> float:
        return quantile(list(self.of(mode)), 0.99)

    def ratio(self, mode: str, floor: str = "floor") -> float:
        """The mode's median over a floor's."""
        return self.median_s(mode) / self.median_s(floor)


def boundary_costs(
    work: Callable[[], object],
    *,
    step_agent: Any,
    mark_agent: Any,
    rounds: int,
    block: int,
    floors: Mapping[str, AbstractContextManager[Any]] | None = None,
    clock: Callable[[], float] = time.perf_counter,
) -> BoundaryCosts:
    """`rounds` rounds of `block` steps of each mode around `work()` (module docstring): each
    floor (default ``{"floor": Floor()}``), `with step_agent.step():`, and
    `mark_agent.mark_step()` (two agents, so that each takes only its own steady path). The
    marked step open at the end is `mark_agent.close()`'s to end."""
    scopes: dict[str, Any] = dict(floors or {"floor": Floor()})
    scopes["step"] = step_agent
    modes = (*scopes, "mark")
    inside: dict[str, list[float]] = {mode: [] for mode in modes}
    for round_index in range(rounds):
        shift = round_index % len(modes)
        for mode in modes[shift:] + modes[:shift]:
            spent = inside[mode]
            if mode == "mark":
                for _ in range(block):
                    t0 = clock()
                    mark_agent.mark_step()
                    t1 = clock()
                    work()
                    spent.append(t1 - t0)
                continue
            scope = scopes[mode]
            for _ in range(block):
                t0 = clock()
                with scope if mode != "step" else scope.step():
                    t1 = clock()
                    work()
                    t2 = clock()
                t3 = clock()
                spent.append((t1 - t0) + (t3 - t2))
    for mode in ("step", "mark"):  # each agent's first step: the slow path, FLOPs counted
        del inside[mode][:1]
    return BoundaryCosts({mode: tuple(values) for mode, values in inside.items()})
