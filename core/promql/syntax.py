"""The few PromQL forms every quantity is written in: a counter's change over a window, a sum by
labels, and a ratio of sums whose denominator is guarded with ``> 0``.

Each expression is one line with single spaces, so it survives YAML folding unchanged (see
`mfuscope.core.promql.rules_file`) and reads the same wherever it is pasted.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

__all__ = [
    "Window",
    "by_clause",
    "joined_matchers",
    "positive",
    "ratio",
    "selector",
    "total",
]


@dataclass(frozen=True)
class Window:
    """How a counter becomes a change over time: ``rate(x[5m])`` (per second) or
    ``increase(x[15m] offset 30m)`` (per range). A ratio of two counters is the same with either,
    as long as both sides use the same window (docs/definitions.md#job-mfu)."""

    function: Literal["rate", "increase"]
    range: str
    offset: str | None = None

    def of(self, metric: str, matchers: str = "") -> str:
        """``rate(metric{matchers}[range])``, with `` offset`` when the window has one."""
        offset = f" offset {self.offset}" if self.offset else ""
        return f"{self.function}({selector(metric, matchers)}[{self.range}]{offset})"


def joined_matchers(*parts: str) -> str:
    """Label matchers joined with ``, ``, the empty ones left out."""
    return ", ".join(part for part in parts if part)


def selector(metric: str, matchers: str = "") -> str:
    """``metric{matchers}``, or the bare name without matchers."""
    return f"{metric}{{{matchers}}}" if matchers else metric


def by_clause(labels: Sequence[str]) -> str:
    """``(a, b)``: the label list of a ``by``, ``on`` or ``without``."""
    return f"({', '.join(labels)})"


def total(inner: str, by: Sequence[str], operator: str = "sum") -> str:
    """``sum by (labels) (inner)``, or ``sum(inner)`` over everything when `by` is empty."""
    if not by:
        return f"{operator}({inner})"
    return f"{operator} by {by_clause(by)} ({inner})"


def positive(expr: str) -> str:
    """``(expr > 0)``: a denominator that yields no sample, rather than +Inf or NaN, at 0."""
    return f"({expr} > 0)"


def ratio(numerator: str, denominator: str, on: Sequence[str] | None = None) -> str:
    """``numerator / (denominator > 0)``; with `on`, the numerator keeps labels the denominator
    lacks (``/ on (job) group_left ()``)."""
    match = "" if on is None else f" on {by_clause(on)} group_left ()"
    return f"{numerator} /{match} {positive(denominator)}"
