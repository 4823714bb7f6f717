"""CPU-side ``ProfilerStep#N`` ranges, the anchor of every step window.

GPU-side step annotations (``gpu_user_annotation ProfilerStep#N``) are not used: on some traces
(a TraceLens MI300X ResNet trace, for one) they are a few microseconds long and say nothing about
where the step's device work lies. The CPU ranges plus the launch of each kernel do.
"""

from __future__ import annotations

from collections.abc import Iterable

import msgspec
from mfuscope.core.trace._scan import Event, ScannedEvents

__all__ = ["OPERATOR_PREFIXES", "CpuStep", "find_profiler_steps"]

_PREFIX = "ProfilerStep#"
OPERATOR_PREFIXES = (_PREFIX,)  # the operators read here (older traces)


class CpuStep(msgspec.Struct, frozen=True):
    """The host range ``[start, end)`` (trace microseconds) of ``ProfilerStep#step``."""

    step: int
    start: float
    end: float


def _candidates(events: Iterable[Event]) -> Iterable[CpuStep]:
    for event in events:
        name = event.name
        if name.startswith(_PREFIX) and event.ph == "X":
            number = name[len(_PREFIX) :]
            if number.isdigit():
                start = float(event.ts)
                yield CpuStep(int(number), start, start + float(event.dur or 0.0))


def find_profiler_steps(scanned: ScannedEvents) -> list[CpuStep]:
    """Profiler steps sorted by start time; one entry per step number (the earliest); empty
    when the trace has none."""
    by_number: dict[int, CpuStep] = {}
    for step in _candidates(scanned.annotations):
        known = by_number.get(step.step)
        if known is None or step.start < known.start:
            by_number[step.step] = step
    if not by_number:
        # Some older traces record the step range as an operator.
        for step in _candidates(scanned.cpu_ops):
            by_number.setdefault(step.step, step)
    return sorted(by_number.values(), key=lambda s: (s.start, s.step))
