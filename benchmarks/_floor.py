"""The floor the agent-overhead benchmarks compare the agent with, and their quantile."""

from __future__ import annotations

import statistics
import time
from types import TracebackType


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


def quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(int(q * len(ordered)), len(ordered) - 1)]


IN_AGENT_HEADER = f"{'in-agent median us':>18} {'p99 us':>7} {'median/floor':>12}"


def in_agent_columns(inside_s: list[float], floor_median_s: float) -> str:
    """Time inside the instrumentation per step: median and p99 (us), and the median over the
    floor's median (the columns under `IN_AGENT_HEADER`)."""
    median = statistics.median(inside_s)
    return (
        f"{median * 1e6:>18.2f} {quantile(inside_s, 0.99) * 1e6:>7.2f} "
        f"{median / floor_median_s:>12.2f}"
    )
