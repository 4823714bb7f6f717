"""One pass over ``traceEvents`` that sorts event references into the categories we use.

No event is copied or converted here: the lists hold the trace's own dicts, so the pass costs a
dict lookup per event. Category names cover current Kineto (``kernel``, ``cuda_runtime``, ...)
and the older PyTorch 1.8-era names (``Kernel``, ``Runtime``, ``Operator``, ...).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = ["ScannedEvents", "named", "scan_events"]

Event = dict[str, Any]


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


def scan_events(events: Sequence[Any]) -> ScannedEvents:
    """Bucket complete (``X``) and metadata (``M``) events by category, in file order."""
    out = ScannedEvents()
    buckets: dict[Any, list[Event]] = {
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
    }
    get_bucket = buckets.get
    meta_append = out.meta.append
    for event in events:
        try:
            bucket = get_bucket(event["cat"])
        except KeyError:  # metadata events carry no category
            if event.get("ph") == "M":
                meta_append(event)
            continue
        if bucket is not None:
            bucket.append(event)
    out.total = len(events)
    return out


def named(events: list[Event], names: frozenset[str]) -> dict[str, list[Event]]:
    """The events whose name is in `names`, grouped by name, in file order.

    One comprehension over the (large) list, then work on the (small) result only.
    """
    picked = [e for e in events if e.get("name") in names]
    out: dict[str, list[Event]] = {name: [] for name in names}
    for event in picked:
        out[event["name"]].append(event)
    return out
