"""`analyze_trace`: one rank's Kineto trace -> its per-step decomposition.

The trace is either a `KinetoTrace` (what `read_trace` decodes, the fast path) or the plain
decoded JSON dict (`load_trace`, traces built in memory), which is first converted into the
same event model (`_events`). Pure: no I/O, clocks or logging, and the input is never mutated.
GPU traces (any kernel on a device) take the device timeline (`_kineto`); CPU-only traces
(gloo) the host timeline (`_gloo`). Both become the same normalised `Timeline`, decomposed by
`_sweep`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import msgspec
from mfuscope.core.errors import TraceError
from mfuscope.core.trace._collectives import ProcessGroups, TopologyView
from mfuscope.core.trace._columns import usable_columns
from mfuscope.core.trace._events import KinetoTrace, as_kineto_trace
from mfuscope.core.trace._evidence import missing_device_timeline
from mfuscope.core.trace._gloo import cpu_timeline
from mfuscope.core.trace._kineto import DEFAULT_GPUS_PER_NODE, gpu_timeline
from mfuscope.core.trace._scan import scan_events
from mfuscope.core.trace._sweep import decompose_timeline
from mfuscope.core.trace._trace_model import RankContext, Timeline
from mfuscope.core.trace.result import AnalysisOptions, RankAnalysis
from mfuscope.core.trace.worker_groups import worker_groups_from_trace

__all__ = ["analyze_trace"]


def _int_field(info: Mapping[str, Any], key: str, default: int) -> int:
    value = info.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise TraceError(None, f"distributedInfo.{key} is not a non-negative integer: {value!r}")
    return value


def build_timeline(trace: Mapping[str, Any] | KinetoTrace, options: AnalysisOptions) -> Timeline:
    """The normalised timeline of `trace` (exposed for tests and tools; see `_trace_model`)."""
    kineto = as_kineto_trace(trace)
    info = kineto.distributed_info
    info = info if isinstance(info, Mapping) else {}
    rank = _int_field(info, "rank", 0)
    world_size = max(_int_field(info, "world_size", 1), rank + 1)
    base_ns = kineto.base_time_ns
    # Kineto timestamps are microseconds since baseTimeNanoseconds (Unix epoch based).
    offset_s = base_ns * 1e-9 if isinstance(base_ns, (int, float)) else 0.0
    try:
        scanned = scan_events(kineto.events)
        # With columns, device events the analysis reads only as numbers are not decoded.
        columns = usable_columns(kineto, scanned)
        on_device = scanned.kernels or scanned.memops or (columns and columns.has_device_events())
        gpus_per_node = options.gpus_per_node
        if on_device and gpus_per_node is None:  # CPU traces: all ranks on one host unless told
            gpus_per_node = DEFAULT_GPUS_PER_NODE
        view = TopologyView(
            world_size=world_size,
            gpus_per_node=gpus_per_node,
            host_of_rank=options.host_of_rank,
            axis_overrides=options.axis_overrides,
        )
        groups = ProcessGroups(info.get("pg_config"))
        worker_groups = options.gloo_worker_groups
        if worker_groups is None:
            worker_groups = worker_groups_from_trace(kineto.mfuscope)
        context = RankContext(
            rank,
            world_size,
            offset_s,
            view,
            groups,
            columns,
            options.window_request,
            gloo_worker_groups=worker_groups,
        )
        if on_device:
            return gpu_timeline(kineto, scanned, context)
        warning = missing_device_timeline(kineto, scanned)
        timeline = cpu_timeline(kineto, scanned, context)
        if warning is None:
            return timeline
        return msgspec.structs.replace(timeline, warnings=(*timeline.warnings, warning))
    except TraceError:
        raise
    except (KeyError, TypeError, AttributeError, ValueError) as exc:
        # A malformed event (missing ts/dur, a string where a number belongs, ...).
        raise TraceError(None, f"malformed trace event ({type(exc).__name__}: {exc})") from exc


_DEFAULT_OPTIONS = AnalysisOptions()  # frozen: safe to share as a default


def analyze_trace(
    trace: Mapping[str, Any] | KinetoTrace, options: AnalysisOptions = _DEFAULT_OPTIONS
) -> RankAnalysis:
    """Decompose every profiled step of one rank's trace (docs/definitions.md#step-buckets).

    `trace` is a `KinetoTrace` from `read_trace` or a decoded Kineto JSON dict (`load_trace`,
    or built in memory). Windows: `options.window_annotation` / `window_range_us` if given, else
    the profiler steps, else the whole trace (`_windows`). Raises `TraceError` (with
    ``path=None``) for input that is not a usable Kineto trace, e.g. one with no activity.
    """
    timeline = build_timeline(trace, options)
    steps = decompose_timeline(timeline, options)
    if not steps:
        raise TraceError(None, "no profiler step has any activity on the timeline")
    return RankAnalysis(
        rank=timeline.rank,
        world_size=timeline.world_size,
        device=timeline.device,
        steps=steps,
        warnings=timeline.warnings,
    )
