"""One pass over ``traceEvents`` that sorts event references into the categories we use.

No event is copied or converted here: the lists hold the trace's own `TraceEvent` Structs, so
the pass costs an attribute read and a dict lookup per event. Category names cover current
Kineto (``kernel``, ``cuda_runtime``, ...) and the older PyTorch 1.8-era names (``Kernel``,
``Runtime``, ``Operator``, ...).
"""

from __future__ import annotations

import itertools
import operator
from collections.abc import Sequence
from dataclasses import dataclass, field

from mfuscope.agent.analysis._events import TraceEvent

__all__ = ["Event", "ScannedEvents", "named", "scan_events"]

Event = TraceEvent
_NAME = operator.attrgetter("name")


@dataclass
class ScannedEvents:
    kernels: list[Event] = field(default_factory=list)
    memops: list[Event] = field(default_factory=list)
    runtime: list[Event] = field(default_factory=list)
    cpu_ops: list[Event] = field(default_factory=list)
    annotations: list[Event] = field(default_factory=list)
    python: list[Event] = field(default_factory=list)
    meta: list[Event] = field(default_factory=list)
    total: int = 0


def scan_events(events: Sequence[Event]) -> ScannedEvents:
    """Bucket events by category, in file order; metadata (``M``) events carry no category."""
    out = ScannedEvents()
    uncategorised: list[Event] = []
    buckets: dict[str | None, list[Event]] = {
        "kernel": out.kernels,
        "Kernel": out.kernels,
        "gpu_memcpy": out.memops,
        "gpu_memset": out.memops,
        "Memcpy": out.memops,
        "Memset": out.memops,
        "cuda_runtime": out.runtime,
        "cuda_driver": out.runtime,
        "Runtime": out.runtime,
        "cpu_op": out.cpu_ops,
        "Operator": out.cpu_ops,
        "user_annotation": out.annotations,
        "python_function": out.python,
        None: uncategorised,
    }
    appenders = {cat: bucket.append for cat, bucket in buckets.items()}
    get_appender = appenders.get
    for event in events:
        append = get_appender(event.cat)
        if append is not None:
            append(event)
    out.meta.extend(e for e in uncategorised if e.ph == "M")
    out.total = len(events)
    return out


def named(events: list[Event], name: str) -> list[Event]:
    """The events called `name`, in file order.

    Compared with ``==`` rather than looked up in a set (the names are fresh strings whose hash
    nothing else needs; unequal lengths fail ``==`` at once), and selected by C-level iterator
    tools rather than a comprehension: this runs over every operator of the trace.
    """
    return list(
        itertools.compress(events, map(operator.eq, map(_NAME, events), itertools.repeat(name)))
    )
