# The C step recorder core (agent/_step_core.c).
from collections.abc import Callable
from types import TracebackType

RING_SLOTS: int
OUTSIDE: int

class StepCore:
    begun: int
    depth: int
    slow_from: int
    last_end_ns: int
    first_step: int
    forwards_matched: int
    steady_forwards: int
    starts: list[int]
    timer: object
    def __enter__(self) -> StepCore: ...
    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None: ...
    @staticmethod
    def clock_ns() -> int: ...

def set_clock(clock: Callable[[], int] | None) -> None: ...

class AgentCore:
    _scope: object
    def step(self, flops: float | None = None, recompute_flops: float | None = None) -> object: ...
