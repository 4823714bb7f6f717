"""Refuse traces whose timings cannot be real before the engine builds anything on them.

A negative duration (seen on NCCL kernels of a broken trace), a negative timestamp, or a value no
profiled window can hold (``dur`` = 1e308) does not make the analysis fail: it makes it wrong
(bus bandwidth off by half, two steps merged into one). The checks here turn such a trace into
a `TraceError` naming the event. Units are the trace's: microseconds.
"""

from __future__ import annotations

import numpy as np
from mfuscope.core.trace._columns import DeviceColumns, EventColumns
from mfuscope.core.trace._events import KinetoTrace

__all__ = ["MAX_EVENT_DURATION_US", "MAX_TIMESTAMP_US", "check_timings"]

# Longer than any profiled window (about 11.6 days).
MAX_EVENT_DURATION_US = 1e12
# Microseconds since the epoch in the year 5138: Kineto's clock (absolute or relative) stays far
# below, and sums of such values stay exact enough in a float.
MAX_TIMESTAMP_US = 1e17


def _problem(ts: float | None, dur: float | None) -> str | None:
    """What is impossible about one complete event's timing, or None."""
    if ts is not None and not 0.0 <= ts <= MAX_TIMESTAMP_US:
        return f"impossible ts {ts!r} us (must be in [0, {MAX_TIMESTAMP_US:g}])"
    if dur is not None and not 0.0 <= dur <= MAX_EVENT_DURATION_US:
        return f"impossible dur {dur!r} us (must be in [0, {MAX_EVENT_DURATION_US:g}])"
    return None


def _check_columns(kind: str, columns: EventColumns, *, check_dur: bool) -> str | None:
    bad = ~((columns.ts >= 0.0) & (columns.ts <= MAX_TIMESTAMP_US))
    if check_dur:
        bad |= ~((columns.dur >= 0.0) & (columns.dur <= MAX_EVENT_DURATION_US))
    if not bad.any():
        return None
    first = int(np.argmax(bad))
    ts, dur = float(columns.ts[first]), float(columns.dur[first])
    problem = _problem(ts, dur if check_dur else None)
    return f"{kind} event at ts {ts!r}: {problem}"


def _check_device_columns(columns: DeviceColumns) -> str | None:
    return (
        _check_columns("kernel", columns.kernels, check_dur=True)
        or _check_columns("memory", columns.memops, check_dur=True)
        or _check_columns("launch", columns.launches, check_dur=False)  # launches' dur unread
    )


def check_timings(trace: KinetoTrace) -> str | None:
    """A one-line description of the first complete event (``ph`` X) with an impossible ``ts``
    or ``dur`` (negative, non-finite or absurdly large), or None if every timing is plausible."""
    for index, event in enumerate(trace.events):
        if event.ph != "X":
            continue
        ts, dur = event.ts, event.dur
        if (ts is None or 0.0 <= ts <= MAX_TIMESTAMP_US) and (
            dur is None or 0.0 <= dur <= MAX_EVENT_DURATION_US
        ):
            continue
        return f"traceEvents[{index}] {event.name!r}: {_problem(ts, dur)}"
    columns = trace.columns
    if isinstance(columns, DeviceColumns):
        return _check_device_columns(columns)
    return None
