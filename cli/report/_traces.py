"""Kineto traces as report input: the engine's per-rank analysis turned into step reports.

A trace carries no FLOPs and no device peak, so those come from `TraceOptions` (as for
`mfuscope analyze`); without them the MFU plots say why they are missing. Each decomposed step
becomes a step report by the agent's own conversion (`core.step_report`).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from mfuscope.cli.report._load import TraceOptions
from mfuscope.core.aggregate.run import Launches, RankRun, RunData
from mfuscope.core.errors import ReportInputError, TraceError
from mfuscope.core.hardware import default_link_tiers, find_device
from mfuscope.core.schema import (
    GroupInfo,
    StepReport,
    Topology,
)
from mfuscope.core.step_report import report_from_decomposition
from mfuscope.core.stragglers import DEFAULT_WINDOW_STEPS
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
    known = find_device(analysis.device) is not None
    tabled = default_link_tiers(analysis.device) if known else {}
    links = {tier: link for tier, link in tabled.items() if tier == "intra_node"}
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
                link_peak_source="datasheet" if tier in links else "unknown",
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
) -> RunData:
    """One `RunData` from the engine's per-rank results (pure); `paths[i]` is the file
    `analyses[i]` came from. Raises `ReportInputError` naming the files of a rank given twice."""
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
    ranks = sorted(analyses, key=lambda a: a.rank)
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
                recent=tuple(
                    step_report_from_decomposition(s, options)
                    for s in a.steps[-DEFAULT_WINDOW_STEPS:]
                ),
            )
            for a in ranks
        ),
        source=source,
        flops_known=options.model_flops_per_step is not None,
        launches=Launches(step_reports=sum(len(a.steps) for a in ranks)),
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
    analyses = []
    for path in paths:
        try:
            trace = read_trace(path)
            analyses.append(analyze_trace(trace, options_for_trace(trace, base)))
        except TraceError as exc:
            raise TraceError(path, exc.message) from None
    job = paths[0].parent.name or paths[0].name
    return run_from_analyses(
        analyses, options, job, f"Kineto traces ({len(paths)} files)", paths=paths
    )
