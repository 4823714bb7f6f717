"""One pass over ``traceEvents`` that sorts event references into the categories we use.

No event is copied or converted here: the lists hold the trace's own `TraceEvent` Structs, so
the pass costs an attribute read and a dict lookup per event. Category names cover current
Kineto (``kernel``, ``cuda_runtime``, ...) and the older PyTorch 1.8-era names (``Kernel``,
``Runtime``, ``Operator``, ...).
"""

from __future__ import annotations

import itertools
import operator
from collections.abc import Callable, Sequence

import msgspec
from mfuscope.core.trace._events import TraceEvent

__all__ = [
    "ANNOTATION_CATEGORIES",
    "DEVICE_ANNOTATION_CATEGORIES",
    "KERNEL_CATEGORIES",
    "MEMOP_CATEGORIES",
    "OPERATOR_CATEGORIES",
    "PYTHON_CATEGORIES",
    "RUNTIME_CATEGORIES",
    "UNREAD_DEVICE_CATEGORIES",
    "Event",
    "ScannedEvents",
    "named",
    "scan_events",
]

Event = TraceEvent
_NAME = operator.attrgetter("name")

# The categories the analysis reads; events of any other category are never looked at.
# Kineto's activity names (libkineto ActivityType.cpp): CUDA/HIP kernels are ``kernel`` (CUDA
# graph replays and Triton kernels too), MTIA device work ``mtia_ccp_events``.
KERNEL_CATEGORIES = ("kernel", "Kernel", "mtia_ccp_events")
MEMOP_CATEGORIES = ("gpu_memcpy", "gpu_memset", "Memcpy", "Memset")
# Host launches: a device event names its launch by correlation id (``cudaLaunchKernel``,
# ``cudaGraphLaunch``, the driver's ``cuLaunchKernel`` that Triton uses, MTIA's runtime).
RUNTIME_CATEGORIES = (
    "cuda_runtime",
    "cuda_driver",
    "Runtime",
    "mtia_runtime",
    "xpu_runtime",
    "privateuse1_runtime",
    "privateuse1_driver",
)
OPERATOR_CATEGORIES = ("cpu_op", "Operator")
ANNOTATION_CATEGORIES = ("user_annotation",)
# Device-side ranges of record_function / ProfilerStep (read only for user-chosen windows).
DEVICE_ANNOTATION_CATEGORIES = ("gpu_user_annotation",)
# Device activity kinds Kineto writes that the analysis cannot read as a timeline: kept, so a
# trace made only of them gets a message naming them instead of a silent CPU analysis.
UNREAD_DEVICE_CATEGORIES = ("hpu_op", "mtia_insight")
PYTHON_CATEGORIES = ("python_function",)


class ScannedEvents(msgspec.Struct):
    kernels: list[Event] = msgspec.field(default_factory=list)
    memops: list[Event] = msgspec.field(default_factory=list)
    runtime: list[Event] = msgspec.field(default_factory=list)
    cpu_ops: list[Event] = msgspec.field(default_factory=list)
    annotations: list[Event] = msgspec.field(default_factory=list)
    device_annotations: list[Event] = msgspec.field(default_factory=list)
    unread_device: list[Event] = msgspec.field(default_factory=list)
    python: list[Event] = msgspec.field(default_factory=list)
    meta: list[Event] = msgspec.field(default_factory=list)


def scan_events(events: Sequence[Event]) -> ScannedEvents:
    """Bucket events by category, in file order; metadata (``M``) events carry no category."""
    out = ScannedEvents()
    uncategorised: list[Event] = []
    buckets = (
        (KERNEL_CATEGORIES, out.kernels),
        (MEMOP_CATEGORIES, out.memops),
        (RUNTIME_CATEGORIES, out.runtime),
        (OPERATOR_CATEGORIES, out.cpu_ops),
        (ANNOTATION_CATEGORIES, out.annotations),
        (DEVICE_ANNOTATION_CATEGORIES, out.device_annotations),
        (UNREAD_DEVICE_CATEGORIES, out.unread_device),
        (PYTHON_CATEGORIES, out.python),
    )
    appenders: dict[str | None, Callable[[Event], None]] = {None: uncategorised.append}
    for categories, bucket in buckets:
        appenders.update(dict.fromkeys(categories, bucket.append))
    get_appender = appenders.get
    for event in events:
        append = get_appender(event.cat)
        if append is not None:
            append(event)
    out.meta.extend(e for e in uncategorised if e.ph == "M")
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
