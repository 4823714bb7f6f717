"""How the windows of a trace are chosen: profiler steps, a user's range, or the whole trace.

In order (docs/analyze.md, "Windows"):
1. a time range the user names (``window_range_us``): one window, source ``range``;
2. an annotation the user names (``window_annotation``, a ``record_function`` range): one
   window per occurrence, source ``annotation:NAME``. A host range anchors its window the way a
   ``ProfilerStep#N`` does (by the launches inside it); without a host range of that name a
   device-side range (``gpu_user_annotation``) is taken as it lies on the device;
3. the ``ProfilerStep#N`` ranges, source ``profiler_step``;
4. none of these (inference, one-off benchmarks, GPU-only or ``torch.compile`` traces): the whole
   span of the timeline as one window, source ``whole_trace``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from mfuscope.core.errors import TraceError
from mfuscope.core.trace._scan import Event, ScannedEvents
from mfuscope.core.trace._steps import CpuStep, find_profiler_steps
from mfuscope.core.trace._trace_model import StepWindow, WindowRequest
from mfuscope.core.trace.result import (
    WINDOW_ANNOTATION_PREFIX,
    WINDOW_RANGE,
    WINDOW_WHOLE_TRACE,
)

__all__ = ["choose_windows"]


# Host ranges -> windows on this timeline (the GPU path maps them through launches).
HostWindows = Callable[[list[CpuStep]], tuple[StepWindow, ...]]


def _host_ranges(events: Iterable[Event], name: str) -> list[CpuStep]:
    found = [(float(e.ts), float(e.dur or 0.0)) for e in events if e.name == name and e.ph == "X"]
    found.sort()
    return [CpuStep(i, ts, ts + dur) for i, (ts, dur) in enumerate(found)]


def _device_ranges(scanned: ScannedEvents, name: str, source: str) -> tuple[StepWindow, ...]:
    windows: list[StepWindow] = []
    previous_end = -float("inf")
    for step in _host_ranges(scanned.device_annotations, name):
        start = max(step.start, previous_end)  # keep windows disjoint
        if step.end > start:
            windows.append(StepWindow(step.step, start, step.end, source))
            previous_end = step.end
    return tuple(windows)


def _annotation_names(scanned: ScannedEvents) -> str:
    names = sorted({e.name for e in scanned.annotations if not e.name.startswith("ProfilerStep#")})
    shown = ", ".join(names[:8]) + (", ..." if len(names) > 8 else "")
    return f"annotations in the trace: {shown}" if names else "the trace has no annotations"


def choose_windows(
    scanned: ScannedEvents,
    request: WindowRequest,
    host_windows: HostWindows,
    span: tuple[float, float] | None,
) -> tuple[StepWindow, ...]:
    """The windows of one rank's timeline (see the module docstring).

    `host_windows` turns host ranges into this timeline's windows (for profiler steps and host
    annotations); `span` is ``(first start, last end)`` of the timeline's activity (None: no
    activity). Raises `TraceError` for a named annotation the trace lacks, or when nothing is
    left to analyse.
    """
    if request.range_us is not None:
        start, end = request.range_us
        return (StepWindow(0, start, end, WINDOW_RANGE),)
    if request.annotation is not None:
        name = request.annotation
        source = WINDOW_ANNOTATION_PREFIX + name
        # Annotations only: operators are left out before decoding on device traces (`_select`),
        # so looking them up would make the answer depend on the reader.
        ranges = _host_ranges(scanned.annotations, name)
        if ranges:
            windows = tuple(
                StepWindow(w.step, w.start, w.end, source) for w in host_windows(ranges)
            )
        else:
            windows = _device_ranges(scanned, name, source)
        if not windows:
            found = "no activity" if ranges else "no such annotation"
            raise TraceError(
                None, f"window annotation {name!r}: {found} ({_annotation_names(scanned)})"
            )
        return windows
    steps = find_profiler_steps(scanned)
    if steps:
        windows = host_windows(steps)
        if windows:
            return windows
    if span is None or not span[1] > span[0]:
        raise TraceError(None, "no activity on the timeline to analyse")
    return (StepWindow(0, span[0], span[1], WINDOW_WHOLE_TRACE),)
