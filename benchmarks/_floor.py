"""The floor the agent-overhead benchmarks compare the agent with, and their quantile."""

from __future__ import annotations

import statistics

# One floor for the benchmarks, the contract tests and validate-gpu.
from mfuscope.agent.hot_path_probe import Floor, quantile

__all__ = ["IN_AGENT_HEADER", "Floor", "in_agent_columns", "quantile"]

IN_AGENT_HEADER = f"{'in-agent median us':>18} {'p99 us':>7} {'median/floor':>12}"


def in_agent_columns(inside_s: list[float], floor_median_s: float) -> str:
    """Time inside the instrumentation per step: median and p99 (us), and the median over the
    floor's median (the columns under `IN_AGENT_HEADER`)."""
    median = statistics.median(inside_s)
    return (
        f"{median * 1e6:>18.2f} {quantile(inside_s, 0.99) * 1e6:>7.2f} "
        f"{median / floor_median_s:>12.2f}"
    )
