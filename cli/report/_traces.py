"""Kineto traces as report input: the engine's per-rank analysis turned into step reports.

A trace carries no FLOPs and no device peak, so those come from `TraceOptions` (as for
`mfuscope analyze`); without them the MFU plots say why they are missing. Collectives of one step
with the same `(op, axis, tier, group_size, bytes)` merge into one sample with a call count, the
way the agent reports them.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from mfuscope.cli.report._data import RankRun, ReportInputError, RunData
from mfuscope.cli.report._load import TraceOptions
from mfuscope.core.hardware import default_link_tiers, find_device
from mfuscope.core.schema import (
    CollectiveSample,
    ComponentShare,
    GroupInfo,
    StepReport,
    Topology,
)
from mfuscope.core.trace.result import RankAnalysis, StepDecomposition

__all__ = [
    "run_from_analyses",
    "run_from_traces",
    "step_report_from_decomposition",
    "topology_from_analysis",
]


def step_report_from_decomposition(step: StepDecomposition, options: TraceOptions) -> StepReport:
    """The schema's step report for one decomposed trace step (pure)."""
    buckets = (
        ("compute", step.compute_s),
        ("recompute", step.recompute_s),
        ("other", step.other_s),
        ("bubble_pipeline", step.bubble_pipeline_s),
        ("bubble_idle", step.bubble_idle_s),
    )
    components = [ComponentShare(name, seconds) for name, seconds in buckets if seconds > 0]
    components += [
        ComponentShare("exposed_comm", e.seconds, axis=e.axis, tier=e.tier)
        for e in step.exposed_comm
        if e.seconds > 0
    ]
    merged: dict[tuple[str, str, str, int, int | None], tuple[int, float, float]] = {}
    for c in step.collectives:
        if c.group_size is None:  # the schema needs a group size; the trace did not say
            continue
        key = (c.op, c.axis, c.tier, c.group_size, c.bytes)
        count, seconds, overlapped = merged.get(key, (0, 0.0, 0.0))
        merged[key] = (count + 1, seconds + c.seconds, overlapped + c.seconds * c.overlapped_ratio)
    collectives = tuple(
        CollectiveSample(op, axis, tier, n, size, count, seconds, min(overlapped, seconds))
        for (op, axis, tier, n, size), (count, seconds, overlapped) in sorted(
            merged.items(), key=lambda kv: repr(kv[0])
        )
    )
    return StepReport(
        step=step.step,
        start_unix_ns=max(0, round(step.start_s * 1e9)),
        wall_s=step.wall_s,
        model_flops=options.model_flops_per_step or 0.0,
        recompute_flops=options.recompute_flops_per_step or 0.0,
        components=tuple(components),
        overlapped_comm_s=step.overlapped_comm_s,
        breakdown_step=step.step,
        collectives=collectives,
    )


def topology_from_analysis(analysis: RankAnalysis) -> Topology:
    """The groups a trace's collectives ran on, with the device's spec link rate per tier (pure).

    A trace does not say which links a machine has: the rate is the vendor reference design's for
    a known GPU (`hardware.default_link_tiers`), and unknown (no spec line) for anything else.
    """
    known = find_device(analysis.device) is not None
    links = default_link_tiers(analysis.device) if known else {}
    groups = sorted(
        {
            (c.axis, c.tier, c.group_size)
            for s in analysis.steps
            for c in s.collectives
            if c.group_size is not None
        }
    )
    return Topology(
        tuple(
            GroupInfo(
                axis=axis,
                tier=tier,
                size=size,
                spans_hosts=tier == "inter_node",
                link_peak_bytes_per_s=links[tier].unidirectional_bytes_per_s
                if tier in links
                else None,
            )
            for axis, tier, size in groups
        )
    )


def run_from_analyses(
    analyses: Sequence[RankAnalysis], options: TraceOptions, job: str, source: str
) -> RunData:
    """One `RunData` from the engine's per-rank results (pure). Raises on duplicate ranks."""
    ranks = sorted(analyses, key=lambda a: a.rank)
    seen = [a.rank for a in ranks]
    if len(set(seen)) != len(seen):
        raise ReportInputError(f"several traces of the same rank ({seen}): pass one per rank")
    return RunData(
        job=job,
        world_size=max(a.world_size for a in ranks),
        ranks=tuple(
            RankRun(
                rank=a.rank,
                host="(from trace)",
                device=a.device,
                peak_flops=options.peak_flops,
                peak_source="user" if options.peak_flops is not None else "unknown",
                steps=tuple(step_report_from_decomposition(s, options) for s in a.steps),
                topology=topology_from_analysis(a),
            )
            for a in ranks
        ),
        source=source,
        flops_known=options.model_flops_per_step is not None,
    )


def run_from_traces(paths: Sequence[Path], options: TraceOptions) -> RunData:
    """Decompose each trace with the engine and gather the ranks into one run."""
    from mfuscope.core.trace import AnalysisOptions, analyze_trace, read_trace

    engine_options = AnalysisOptions(
        gpus_per_node=options.gpus_per_node,
        model_flops_per_step=options.model_flops_per_step,
        recompute_flops_per_step=options.recompute_flops_per_step,
        peak_flops=options.peak_flops,
    )
    analyses = [analyze_trace(read_trace(path), engine_options) for path in paths]
    job = paths[0].parent.name or paths[0].name
    return run_from_analyses(analyses, options, job, f"Kineto traces ({len(paths)} files)")
