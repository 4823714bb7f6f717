"""`analysis_to_json`: the ``mfuscope.analysis/1`` JSON document (`mfuscope analyze --json`).

The shape is a public contract (docs/analyze.md): keys are stable, values in base units (seconds,
bytes, bytes/s), ``null`` for unknown ``mfu`` / ``hfu`` / ``bytes`` / ``group_size`` /
bandwidths. ``window_source`` says how each window was chosen: ``profiler_step``,
``whole_trace``, ``annotation:NAME`` or ``range`` (docs/analyze.md, "Windows");
``compute_class_s`` / ``recompute_class_s`` split those buckets by kernel class (``null`` on CPU
timelines);
``waterfall`` holds the slices of ``1 - mfu`` (``elementwise`` is the unfused / memory-bound
kernels' slice), ``null`` when MFU is unknown.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from mfuscope.core.mfu import StepBuckets, mfu_waterfall
from mfuscope.core.trace.result import (
    CollectiveRecord,
    ExposedComm,
    RankAnalysis,
    StepDecomposition,
)
from mfuscope.core.vocabulary import TRACE_COMPONENTS

__all__ = ["ANALYSIS_SCHEMA", "analysis_to_json"]

ANALYSIS_SCHEMA = "mfuscope.analysis/1"


def _exposed(entry: ExposedComm) -> dict[str, Any]:
    return {"axis": entry.axis, "tier": entry.tier, "seconds": entry.seconds}


def _collective(record: CollectiveRecord) -> dict[str, Any]:
    return {
        "op": record.op,
        "axis": record.axis,
        "tier": record.tier,
        "group_size": record.group_size,
        "group_size_reason": record.group_size_reason,
        "bytes": record.bytes,
        "seconds": record.seconds,
        "algbw_bytes_per_s": record.algbw_bytes_per_s,
        "busbw_bytes_per_s": record.busbw_bytes_per_s,
        "overlapped_ratio": record.overlapped_ratio,
    }


def _waterfall(step: StepDecomposition) -> dict[str, float] | None:
    """The step's MFU waterfall slices (`mfu.mfu_waterfall`), None when MFU is unknown.

    The waterfall depends on the FLOPs and the peak only through ``model_flops / peak =
    mfu * wall_s``, so it is computed with a peak of 1 FLOP/s.
    """
    if step.mfu is None:
        return None
    elementwise = (
        0.0 if step.compute_classes is None else step.compute_classes.elementwise_norm_reduce
    )
    buckets = StepBuckets.of(
        {c: getattr(step, f"{c}_s") for c in TRACE_COMPONENTS},
        elementwise_s=min(elementwise, step.compute_s),
    )
    try:
        return mfu_waterfall(step.mfu * step.wall_s, 1.0, buckets).slices()
    except ValueError:  # FLOPs but no compute time: no honest split (see mfu_waterfall)
        return None


def _step(step: StepDecomposition) -> dict[str, Any]:
    return {
        "step": step.step,
        "window_source": step.window_source,
        "start_s": step.start_s,
        "wall_s": step.wall_s,
        "compute_s": step.compute_s,
        "recompute_s": step.recompute_s,
        "exposed_comm_s": step.exposed_comm_s,
        "other_s": step.other_s,
        "bubble_s": step.bubble_s,
        "bubble_pipeline_s": step.bubble_pipeline_s,
        "bubble_idle_s": step.bubble_idle_s,
        "overlapped_comm_s": step.overlapped_comm_s,
        "exposed_comm": [_exposed(e) for e in step.exposed_comm],
        "collectives": [_collective(c) for c in step.collectives],
        "mfu": step.mfu,
        "hfu": step.hfu,
        "compute_class_s": None if step.compute_classes is None else step.compute_classes.as_dict(),
        "recompute_class_s": (
            None if step.recompute_classes is None else step.recompute_classes.as_dict()
        ),
        "waterfall": _waterfall(step),
    }


def analysis_to_json(ranks: Sequence[RankAnalysis], warnings: Sequence[str] = ()) -> dict[str, Any]:
    """The JSON-ready document for the analyses of one or more ranks, in the given order;
    `warnings` about the set of inputs (`inputs.input_warnings`) and each rank's own."""
    return {
        "schema": ANALYSIS_SCHEMA,
        "warnings": list(warnings),
        "ranks": [
            {
                "rank": r.rank,
                "world_size": r.world_size,
                "device": r.device,
                "warnings": list(r.warnings),
                "steps": [_step(s) for s in r.steps],
            }
            for r in ranks
        ],
    }
