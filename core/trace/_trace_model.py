"""The normalised timeline one rank's trace becomes before it is decomposed.

Times stay in the trace's unit (microseconds on the trace clock) until the decomposition
converts its results to seconds: no per-event unit conversion on the hot path.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

import msgspec
import numpy as np
from mfuscope.core.trace._intervals import Spans
from numpy.typing import NDArray

if TYPE_CHECKING:  # annotations only: both modules import this one
    from mfuscope.core.trace._collectives import ProcessGroups, TopologyView
    from mfuscope.core.trace._columns import DeviceColumns

__all__ = [
    "WINDOW_ANNOTATION_PREFIX",
    "WINDOW_PROFILER_STEP",
    "WINDOW_RANGE",
    "WINDOW_WHOLE_TRACE",
    "CommActivity",
    "RankContext",
    "StepWindow",
    "Timeline",
    "WindowRequest",
]

# How a window was chosen (`StepDecomposition.window_source`; docs/analyze.md, "Windows");
# `result` re-exports them.
WINDOW_PROFILER_STEP = "profiler_step"
WINDOW_WHOLE_TRACE = "whole_trace"
WINDOW_RANGE = "range"
WINDOW_ANNOTATION_PREFIX = "annotation:"  # then the annotation's name

# The engine's private records are msgspec Structs, not dataclasses: a frozen dataclass compiles
# each generated method by its own exec, many times the cost of a Struct class, and `mfuscope
# analyze` makes all of them at start-up (benchmarks/RESULTS.md#whole-process-and-start-up).


class CommActivity(msgspec.Struct, frozen=True):
    """One communication interval on the timeline: an NCCL/RCCL kernel or a gloo work item.

    `op` is an nccl-tests op name, `_collectives.BOOKKEEPING` (barrier: it occupies the timeline
    but is no collective record) or None (a kernel whose op the trace does not say).
    `group_size` and `bytes` are None when unknown. ``[start, end)`` is the time it is in flight;
    `duration` (what bandwidth is computed from) is the event's own ``dur``
    (``end - start`` of two timestamps near 1e12 µs would lose a nanosecond to rounding).
    """

    start: float
    end: float
    duration: float
    op: str | None
    axis: str
    tier: str
    group_size: int | None
    bytes: int | None
    group_unknown_reason: str | None = None  # why `group_size` is None
    # Time in flight before `duration` began (µs): a gloo work item waiting for its worker
    # after its enqueue (`start` is then the enqueue); 0 for kernels.
    queued: float = 0.0

    def sort_key(self) -> tuple[float, float, str, str, str, int, int]:
        return (
            self.start,
            self.end,
            self.op or "",
            self.axis,
            self.tier,
            self.group_size or 0,
            -1 if self.bytes is None else self.bytes,
        )


class WindowRequest(msgspec.Struct, frozen=True):
    """The user's choice of windows (both None: profiler steps, else the whole trace; see
    `_windows`). `range_us` is ``(start, end)`` in the trace's own ``ts`` clock (microseconds)."""

    annotation: str | None = None
    range_us: tuple[float, float] | None = None

    def __post_init__(self) -> None:
        if self.annotation is not None and not self.annotation:
            raise ValueError("window annotation must be a non-empty name")
        if self.range_us is not None:
            start, end = self.range_us
            if not end > start:
                raise ValueError(f"window range must end after it starts, got {start}:{end}")


class RankContext(msgspec.Struct, frozen=True):
    """What both timelines (`_kineto`, `_gloo`) take besides the events: who the trace is from,
    how its groups map to axes and tiers, and the columns `read_trace` read (None: none)."""

    rank: int
    world_size: int
    clock_offset_s: float
    view: TopologyView
    groups: ProcessGroups
    columns: DeviceColumns | None
    windows: WindowRequest = msgspec.field(default_factory=WindowRequest)
    # gloo worker thread id -> process-group name (`AnalysisOptions.gloo_worker_groups`, else
    # the trace's own ``mfuscope`` key); None when neither says.
    gloo_worker_groups: Mapping[int, str] | None = None


class StepWindow(msgspec.Struct, frozen=True):
    """The timeline window ``[start, end)`` of profiler step `step` (or of the `step`-th
    occurrence of a chosen annotation); `source` says how it was chosen (`_windows`)."""

    step: int
    start: float
    end: float
    source: str = WINDOW_PROFILER_STEP


class Timeline(msgspec.Struct, frozen=True):
    """Everything the decomposition needs from one rank's trace.

    `compute`, `recompute` and `other` are raw intervals (they may overlap and be unsorted);
    `clock_offset_s` turns a trace timestamp into `start_s`: ``ts * 1e-6 + clock_offset_s``.
    """

    rank: int
    world_size: int
    device: str
    clock_offset_s: float
    windows: tuple[StepWindow, ...]
    compute: Spans
    recompute: Spans
    other: Spans
    comms: tuple[CommActivity, ...]
    warnings: tuple[str, ...] = ()
    # Per compute / recompute span: its kernel class (a position in
    # `kernel_classes.KERNEL_CLASSES`); None on timelines without kernels (CPU).
    compute_class: NDArray[np.int8] | None = None
    recompute_class: NDArray[np.int8] | None = None
    # Per compute span: its kernel family (a position in `kernel_classes.FAMILY_NAMES`).
    compute_family: NDArray[np.int16] | None = None
