"""Kineto traces as report input: the engine's per-rank analysis turned into step reports.

A trace carries no FLOPs and no device peak: the FLOPs come from `TraceOptions`, the peak from
them or else the datasheet table for the trace's device and `dtype` (as for `mfuscope analyze`);
without them the MFU plots say why they are missing. Each decomposed step
becomes a step report by the agent's own conversion (`core.step_report`).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from mfuscope.cli.report._load import TraceOptions
from mfuscope.core.errors import ReportInputError, TraceError
from mfuscope.core.hardware import PeakLookup
from mfuscope.core.run_summary.run_data import Launches, RankRun, RunData
from mfuscope.core.schema import (
    GroupInfo,
    StepReport,
    Topology,
)
from mfuscope.core.step_report import report_from_decomposition
from mfuscope.core.stragglers import DEFAULT_WINDOW_STEPS
from mfuscope.core.trace.options import trace_tier_specs
from mfuscope.core.trace.result import RankAnalysis, StepDecomposition

__all__ = [
    "run_from_analyses",
    "run_from_traces",
    "step_report_from_decomposition",
    "topology_from_analysis",
]


def step_report_from_decomposition(step: StepDecomposition, options: TraceOptions) -> StepReport:
    """The schema's step report for one decomposed trace step, as the agent would send it."""
    return report_from_decomposition(
        step,
        start_unix_ns=max(0, round(step.start_s * 1e9)),
        model_flops=options.model_flops_per_step or 0.0,
        recompute_flops=options.recompute_flops_per_step or 0.0,
    )


def topology_from_analysis(analysis: RankAnalysis) -> Topology:
    """The groups a trace's collectives ran on, with the device's spec link rate per tier (pure).

    A trace does not say which links a machine has: the intra-node rate is the datasheet's for a
    known GPU (`hardware.default_link_tiers`). Inter-node specs are unknown (no spec line): they
    depend on how many of a group's ranks share a node (docs/definitions.md#link-specs), which a
    trace does not say; so is anything on an unknown device or a CPU.
    """
    specs = trace_tier_specs(analysis.device)
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
                link_peak_bytes_per_s=specs.get(tier),
                link_peak_source="datasheet" if tier in specs else "unknown",
            )
            for axis, tier, size in groups
        )
    )


def run_from_analyses(
    analyses: Sequence[RankAnalysis],
    options: TraceOptions,
    job: str,
    source: str,
    paths: Sequence[Path] = (),
    peaks: Sequence[PeakLookup] = (),
) -> RunData:
    """One `RunData` from the engine's per-rank results (pure); `paths[i]` is the file
    `analyses[i]` came from and `peaks[i]` its peak (default: `options.peak_flops` as given).
    Raises `ReportInputError` naming the files of a rank given twice."""
    files: dict[int, list[str]] = {}
    for index, analysis in enumerate(analyses):
        name = str(paths[index]) if index < len(paths) else f"trace {index + 1}"
        files.setdefault(analysis.rank, []).append(name)
    repeated = {rank: names for rank, names in files.items() if len(names) > 1}
    if repeated:
        rank, names = min(repeated.items())
        raise ReportInputError(
            f"several traces of rank {rank}: {', '.join(names)}; pass one trace per rank (a "
            "report shows one run of the job)"
        )
    default = (
        PeakLookup(options.peak_flops, "user", None, "given")
        if options.peak_flops
        else PeakLookup(None, "unknown", None, "no peak given")
    )
    pairs = sorted(
        ((a, peaks[i] if i < len(peaks) else default) for i, a in enumerate(analyses)),
        key=lambda pair: pair[0].rank,
    )
    return RunData(
        job=job,
        world_size=max(a.world_size for a in analyses),
        ranks=tuple(_rank_run(a, peak, options) for a, peak in pairs),
        source=source,
        flops_known=options.model_flops_per_step is not None,
        launches=Launches(step_reports=sum(len(a.steps) for a in analyses)),
    )


def _mean_families(analysis: RankAnalysis) -> tuple[tuple[str, float], ...]:
    """Each kernel family's mean kernel seconds per step over the rank's steps, largest first."""
    sums: dict[str, float] = {}
    for step in analysis.steps:
        for family, seconds in step.compute_families:
            sums[family] = sums.get(family, 0.0) + seconds
    steps = len(analysis.steps)
    return tuple(sorted(((f, s / steps) for f, s in sums.items()), key=lambda fs: -fs[1]))


def _rank_run(analysis: RankAnalysis, peak: PeakLookup, options: TraceOptions) -> RankRun:
    steps = tuple(step_report_from_decomposition(s, options) for s in analysis.steps)
    return RankRun(
        kernel_families=_mean_families(analysis),
        rank=analysis.rank,
        host="(from trace)",
        device=analysis.device,
        peak_flops=peak.peak_flops,
        peak_source=peak.source,
        steps=steps,
        topology=topology_from_analysis(analysis),
        recent=steps[-DEFAULT_WINDOW_STEPS:],
    )


def run_from_traces(paths: Sequence[Path], options: TraceOptions) -> RunData:
    """Decompose each trace with the engine and gather the ranks into one run."""
    from mfuscope.core.trace import analyze_trace, read_trace
    from mfuscope.core.trace.options import analysis_options, options_for_trace

    base = analysis_options(
        device=None,  # per trace, below: the same options `mfuscope analyze` builds
        gpus_per_node=options.gpus_per_node,
        model_flops_per_step=options.model_flops_per_step,
        recompute_flops_per_step=options.recompute_flops_per_step,
        peak_flops=options.peak_flops,
    )
    analyses, peaks = [], []
    for path in paths:
        try:
            trace = read_trace(path)
            traced, peak = options_for_trace(trace, base, options.dtype)
            analyses.append(analyze_trace(trace, traced))
        except TraceError as exc:
            raise TraceError(path, exc.message) from None
        peaks.append(peak)
    job = paths[0].parent.name or paths[0].name
    return run_from_analyses(
        analyses, options, job, f"Kineto traces ({len(paths)} files)", paths=paths, peaks=peaks
    )
