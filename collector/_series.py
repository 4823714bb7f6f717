"""The metric contract: a snapshot turned into the exported metric families.

Names, types and labels here are public (docs/reference/metrics.md, generated from here). Counters
are the primary series: they aggregate exactly with PromQL ``sum``/``rate`` across
ranks, nodes and collectors. Gauges describe the latest window and do not aggregate that way.
``rank`` is a label only with per-rank labels on, except on `mfuscope_straggler_ratio`.
Definitions: docs/definitions.md#counters-and-gauges.
"""

from __future__ import annotations

from collections.abc import Callable

from mfuscope.collector._comm_series import comm_families
from mfuscope.collector._device_series import device_families
from mfuscope.collector._errors import (
    LIMIT_REASONS,
    BadRequest,
    PayloadTooLarge,
    RateLimited,
    Unauthorized,
    UnsupportedMediaType,
    UnsupportedVersion,
)
from mfuscope.collector._snapshot import (
    STEP_DURATION_BOUNDS_S,
    CollectiveTotals,
    CollectorSnapshot,
    JobSnapshot,
    SeriesTotals,
)
from mfuscope.core.ledger import CATEGORIES
from mfuscope.core.vocabulary import COMPONENTS
from mfuscope.exporters.model import HistogramSample, MetricFamily, MetricKind, Sample

__all__ = ["REJECT_REASONS", "metric_families"]

# Every reason a batch can be refused for, exported from zero so `rate()` works before the first.
REJECT_REASONS: tuple[str, ...] = tuple(
    sorted(
        {
            *LIMIT_REASONS,
            *(
                e.reason
                for e in (
                    BadRequest,
                    UnsupportedVersion,
                    Unauthorized,
                    PayloadTooLarge,
                    RateLimited,
                    UnsupportedMediaType,
                )
            ),
        }
    )
)

_CollectiveField = Callable[[CollectiveTotals], float]
# Sources (docs/definitions.md#collective-records): "always-on" is the agents' flight-recorder
# records, which cover every completed call; a rank without them (an older agent, the recorder
# off) contributes its profiled windows' samples instead.
_COLLECTIVE_COUNTERS: tuple[tuple[str, str, str, _CollectiveField], ...] = (
    (
        "calls",
        "{call}",
        "collective and point-to-point calls: every completed call (always-on flight-recorder "
        "records), or those in profiled windows for ranks without records",
        lambda c: c.calls,
    ),
    (
        "bytes",
        "By",
        "collective size S (nccl-tests definition) of the calls whose size is known, bytes "
        "(same sources as calls)",
        lambda c: c.bytes,
    ),
    (
        "bus_bytes",
        "By",
        "collective size S x nccl-tests bus factor, bytes (same sources as calls)",
        lambda c: c.bus_bytes,
    ),
    (
        "seconds",
        "s",
        "collective duration, seconds: always-on where the backend times collectives (NCCL with "
        "timing), else from profiled windows",
        lambda c: c.seconds,
    ),
    (
        "sized_seconds",
        "s",
        "duration of the collective calls whose size and group size are known (the busbw "
        "denominator), seconds (same sources as seconds)",
        lambda c: c.sized_seconds,
    ),
    (
        "sized_bus_bytes",
        "By",
        "bus bytes of exactly the calls in sized_seconds (the busbw numerator: busbw = "
        "rate(sized_bus_bytes) / rate(sized_seconds)), bytes",
        lambda c: c.sized_bus_bytes,
    ),
    (
        "overlapped_seconds",
        "s",
        "collective time hidden under compute, seconds (profiled windows)",
        lambda c: c.overlapped_seconds,
    ),
    (
        "profiled_seconds",
        "s",
        "collective time inside profiled windows (what overlapped_seconds is a part of), seconds",
        lambda c: c.profiled_seconds,
    ),
)


class _Builder:
    def __init__(self, per_rank: bool) -> None:
        self.per_rank = per_rank
        self.families: list[MetricFamily] = []

    def who(self, job: str, totals: SeriesTotals) -> tuple[str, ...]:
        return (job, str(totals.rank)) if self.per_rank else (job,)

    @property
    def who_labels(self) -> tuple[str, ...]:
        return ("job", "rank") if self.per_rank else ("job",)

    def add(
        self,
        name: str,
        kind: MetricKind,
        unit: str,
        help_text: str,
        labels: tuple[str, ...],
        samples: list[Sample],
    ) -> None:
        self.families.append(
            MetricFamily(
                name=name,
                kind=kind,
                help=help_text,
                unit=unit,
                label_names=labels,
                samples=tuple(samples),
            )
        )


def _time_seconds(totals: SeriesTotals) -> tuple[float, ...]:
    """The ledger's seconds per category, every category exported from 0."""
    return totals.time_seconds or (0.0,) * len(CATEGORIES)


def _totals_counters(b: _Builder, jobs: tuple[JobSnapshot, ...]) -> None:
    scalar: tuple[tuple[str, str, str, Callable[[SeriesTotals], float]], ...] = (
        ("mfuscope_steps_total", "{step}", "step reports accepted", lambda t: t.steps),
        (
            "mfuscope_step_seconds_total",
            "s",
            "sum of step wall time over ranks, seconds",
            lambda t: t.step_seconds,
        ),
        (
            "mfuscope_model_flops_total",
            "{flop}",
            "model FLOPs (the MFU numerator)",
            lambda t: t.model_flops,
        ),
        (
            "mfuscope_hardware_flops_total",
            "{flop}",
            "model + recompute FLOPs (the HFU numerator)",
            lambda t: t.hardware_flops,
        ),
        (
            "mfuscope_peak_flop_seconds_total",
            "{flop}",
            "dense peak FLOP/s of the rank's device x step wall time, summed over steps (the MFU "
            "denominator: MFU = increase(model FLOPs) / increase(this) over any range)",
            lambda t: t.peak_flop_seconds,
        ),
        (
            "mfuscope_overlapped_comm_seconds_total",
            "s",
            "communication hidden under compute, seconds",
            lambda t: t.overlapped_comm_seconds,
        ),
        (
            "mfuscope_reports_duplicate_total",
            "{report}",
            "re-sent step reports acknowledged and not counted",
            lambda t: t.duplicates,
        ),
        (
            "mfuscope_rerun_steps_total",
            "{step}",
            "step reports accepted whose step an earlier launch of the job had already reported "
            "(work redone after a restart; also in mfuscope_steps_total)",
            lambda t: t.reruns,
        ),
        (
            "mfuscope_useful_model_flops_total",
            "{flop}",
            "model FLOPs of the steps that advanced training (redone steps left out): the "
            "effective MFU numerator",
            lambda t: t.useful_model_flops,
        ),
        (
            "mfuscope_job_peak_flop_seconds_total",
            "{flop}",
            "dense peak FLOP/s of the rank's device x its rank-seconds in every job-time "
            "category, summed (the effective MFU denominator: effective MFU = increase(useful "
            "model FLOPs) / increase(this))",
            lambda t: t.time_peak_flop_seconds,
        ),
    )
    for name, unit, help_text, get in scalar:
        samples = [
            Sample(b.who(j.job, t), float(get(t)), t.start_unix_ns) for j in jobs for t in j.totals
        ]
        b.add(name, "counter", unit, help_text, b.who_labels, samples)
    b.add(
        "mfuscope_job_restarts_total",
        "counter",
        "{restart}",
        "new launches of the job (agent incarnations) after the first one seen",
        ("job",),
        [Sample((j.job,), float(j.restarts), j.start_unix_ns) for j in jobs],
    )

    b.add(
        "mfuscope_job_rank_seconds_total",
        "counter",
        "s",
        "each rank's seconds from its process start to its exit, by job-time category "
        f"({', '.join(CATEGORIES)}): the categories sum to the ranks' rank-seconds",
        (*b.who_labels, "category"),
        [
            Sample((*b.who(j.job, t), category), seconds, t.start_unix_ns)
            for j in jobs
            for t in j.totals
            for category, seconds in zip(CATEGORIES, _time_seconds(t), strict=True)
        ],
    )
    b.add(
        "mfuscope_step_component_seconds_total",
        "counter",
        "s",
        f"step time per bucket ({', '.join(COMPONENTS)}); axis and tier set on exposed_comm, "
        "axis pp on bubble_pipeline, seconds",
        (*b.who_labels, "component", "axis", "tier"),
        [
            Sample((*b.who(j.job, t), c.component, c.axis, c.tier), c.seconds, t.start_unix_ns)
            for j in jobs
            for t in j.totals
            for c in t.components
        ],
    )
    b.add(
        "mfuscope_compute_class_seconds_total",
        "counter",
        "s",
        "compute time per kernel class (gemm, attention, elementwise_norm_reduce, other), from "
        "profiled windows; sums to the compute component over the steps that carry it, seconds",
        (*b.who_labels, "class"),
        [
            Sample((*b.who(j.job, t), name), seconds, t.start_unix_ns)
            for j in jobs
            for t in j.totals
            for name, seconds in t.compute_classes
        ],
    )
    for suffix, unit, help_text, cget in _COLLECTIVE_COUNTERS:
        b.add(
            f"mfuscope_collective_{suffix}_total",
            "counter",
            unit,
            help_text,
            (*b.who_labels, "op", "axis", "tier"),
            [
                Sample((*b.who(j.job, t), c.op, c.axis, c.tier), float(cget(c)), t.start_unix_ns)
                for j in jobs
                for t in j.totals
                for c in t.collectives
            ],
        )
    b.families.append(
        MetricFamily(
            name="mfuscope_step_duration_seconds",
            kind="histogram",
            help="per-rank step wall time, seconds",
            unit="s",
            label_names=b.who_labels,
            bounds=STEP_DURATION_BOUNDS_S,
            histogram_samples=tuple(
                HistogramSample(
                    labels=b.who(j.job, t),
                    bucket_counts=t.step_duration.bucket_counts,
                    sum=t.step_duration.sum,
                    min=t.step_duration.min,
                    max=t.step_duration.max,
                    start_unix_ns=t.start_unix_ns,
                )
                for j in jobs
                for t in j.totals
            ),
        )
    )


# (metric, AgentHealth field, OTLP unit, help): the agents' cumulative health counters.
_HEALTH: tuple[tuple[str, str, str, str], ...] = (
    (
        "mfuscope_reports_dropped_total",
        "reports_dropped_total",
        "{report}",
        "reports the agents dropped",
    ),
    (
        "mfuscope_agent_send_failures_total",
        "send_failures_total",
        "{failure}",
        "send attempts of the agents that failed",
    ),
    (
        "mfuscope_profiler_failures_total",
        "profiler_failures_total",
        "{failure}",
        "profiled windows the agents failed to analyse",
    ),
    (
        "mfuscope_agent_windows_analysed_total",
        "windows_analysed_total",
        "{window}",
        "profiled windows the agents analysed",
    ),
)


def _health(b: _Builder, jobs: tuple[JobSnapshot, ...]) -> None:
    for name, field, unit, help_text in _HEALTH:
        if b.per_rank:
            samples = [
                Sample(
                    (j.job, str(r.rank)),
                    float(getattr(r.health, field)),
                    r.health_start_unix_ns,
                )
                for j in jobs
                for r in j.ranks
            ]
        else:
            samples = [
                Sample((j.job,), float(getattr(j.health, field)), j.start_unix_ns) for j in jobs
            ]
        b.add(
            name,
            "counter",
            unit,
            f"{help_text} (the agents' cumulative counts, kept across rank expiry and agent "
            "restarts)",
            b.who_labels,
            samples,
        )


def _gauges(b: _Builder, jobs: tuple[JobSnapshot, ...]) -> None:
    job_l = ("job",)
    if b.per_rank:
        peak = [
            Sample((j.job, str(r.rank)), r.peak_flops)
            for j in jobs
            for r in j.ranks
            if r.peak_flops is not None
        ]
        age = [
            Sample((j.job, str(r.rank)), r.last_report_age_s)
            for j in jobs
            for r in j.ranks
            if not r.closed
        ]
    else:
        peak = [Sample((j.job,), j.peak_flops) for j in jobs]
        age = [Sample((j.job,), j.last_report_age_s) for j in jobs if not j.all_closed]
    b.add(
        "mfuscope_peak_flops",
        "gauge",
        "{flop}/s",
        "dense peak FLOP/s of the live ranks' devices (summed per job)",
        b.who_labels,
        peak,
    )
    b.add(
        "mfuscope_last_report_age_seconds",
        "gauge",
        "s",
        "seconds since the latest report of the most silent live rank whose agent has not closed",
        b.who_labels,
        age,
    )
    b.add(
        "mfuscope_breakdown_age_seconds",
        "gauge",
        "s",
        "seconds since the collector received the newest profiled window of any live rank: the "
        "age of the step breakdown and of the collective figures that come only from windows "
        "(absent before the first window)",
        job_l,
        [Sample((j.job,), j.breakdown_age_s) for j in jobs if j.breakdown_age_s is not None],
    )
    b.add(
        "mfuscope_breakdown_spread_ratio",
        "gauge",
        "1",
        "how far a carried breakdown can be off: the largest spread (max - min) of exposed "
        "communication's share of the step between the latest profiled windows of any live rank "
        "(absent before a rank has two windows)",
        job_l,
        [Sample((j.job,), j.breakdown_spread) for j in jobs if j.breakdown_spread is not None],
    )
    simple: tuple[tuple[str, str, str, Callable[[JobSnapshot], float]], ...] = (
        (
            "mfuscope_ranks",
            "{rank}",
            "live ranks reporting to this collector",
            lambda j: j.live_ranks,
        ),
        ("mfuscope_world_size", "{rank}", "world size the ranks report", lambda j: j.world_size),
        (
            "mfuscope_peak_flops_unknown_ranks",
            "{rank}",
            "live ranks whose device peak FLOP/s is unknown",
            lambda j: j.peak_unknown_ranks,
        ),
        (
            "mfuscope_tp_spans_hosts",
            "1",
            "1 when a tensor-parallel group spans hosts",
            lambda j: 1.0 if j.tp_spans_hosts else 0.0,
        ),
    )
    for name, unit, help_text, get in simple:
        b.add(
            name, "gauge", unit, help_text, job_l, [Sample((j.job,), float(get(j))) for j in jobs]
        )
    b.add(
        "mfuscope_run_info",
        "gauge",
        "1",
        "1 with the job's run key: which runs are the same workload (by default a fingerprint of "
        "model FLOPs per step, world size, layout, device and dtype), for the baseline across runs",
        ("job", "run_key"),
        [Sample((j.job, j.run_key), 1.0) for j in jobs if j.run_key],
    )
    for name, attr, help_text in (
        ("mfuscope_mfu_ratio", "mfu", "MFU over each live rank's latest window of steps"),
        ("mfuscope_hfu_ratio", "hfu", "HFU over each live rank's latest window of steps"),
    ):
        b.add(
            name,
            "gauge",
            "1",
            help_text,
            job_l,
            [
                Sample((j.job,), value)
                for j in jobs
                if (value := getattr(j.latest, attr)) is not None
            ],
        )
    b.add(
        "mfuscope_step_component_ratio",
        "gauge",
        "1",
        "fraction of step time per bucket, from each rank's latest breakdown",
        ("job", "component", "axis", "tier"),
        [Sample((j.job, c, a, t), f) for j in jobs for c, a, t, f in j.latest.component_fractions],
    )
    axis_tier = ("job", "axis", "tier")
    b.add(
        "mfuscope_tier_peak_bandwidth_bytes_per_second",
        "gauge",
        "By/s",
        "spec unidirectional link rate of the groups on this axis and tier, bytes/s",
        axis_tier,
        [Sample((j.job, p.axis, p.tier), p.bytes_per_s) for j in jobs for p in j.tier_peaks],
    )
    b.add(
        "mfuscope_tier_peak_info",
        "gauge",
        "1",
        "1 for each link spec source stated on this axis and tier (datasheet, sysfs, nvml, user, "
        "or unknown: no spec, so no efficiency)",
        ("job", "axis", "tier", "source"),
        [Sample((j.job, a, t, src), 1.0) for j in jobs for a, t, src in j.tier_spec_sources],
    )
    b.add(
        "mfuscope_collective_bus_bandwidth_bytes_per_second",
        "gauge",
        "By/s",
        "nccl-tests bus bandwidth over each rank's latest profiled step, bytes/s",
        axis_tier,
        [Sample((j.job, a, t), bw) for j in jobs for a, t, bw, _ in j.latest.tier_busbw],
    )
    b.add(
        "mfuscope_collective_bus_bandwidth_ratio",
        "gauge",
        "1",
        "bus bandwidth / the tier's spec peak (only where the peak is known)",
        axis_tier,
        [
            Sample((j.job, a, t), eff)
            for j in jobs
            for a, t, _, eff in j.latest.tier_busbw
            if eff is not None
        ],
    )
    b.add(
        "mfuscope_straggler_ratio",
        "gauge",
        "1",
        "recent step time of the slowest ranks / median over the job's ranks",
        ("job", "rank", "host", "node"),
        [
            Sample((j.job, str(s.rank), host, node), s.ratio)
            for j in jobs
            for s, host, node in zip(
                j.stragglers,
                j.straggler_hosts,
                j.straggler_nodes,
                strict=True,
            )
        ],
    )


def metric_families(snapshot: CollectorSnapshot) -> tuple[MetricFamily, ...]:
    """All exported families for `snapshot`, in a fixed order (exposition tests compare text)."""
    b = _Builder(snapshot.per_rank_labels)
    _totals_counters(b, snapshot.jobs)
    _health(b, snapshot.jobs)
    _gauges(b, snapshot.jobs)
    b.families.extend(device_families(snapshot.jobs, per_rank=snapshot.per_rank_labels))
    comm_families(snapshot.jobs, b.add)
    rejected = dict.fromkeys(REJECT_REASONS, 0) | dict(snapshot.rejected)
    b.add(
        "mfuscope_reports_rejected_total",
        "counter",
        "{batch}",
        "batches the collector refused, by reason",
        ("reason",),
        [Sample((reason,), float(count)) for reason, count in sorted(rejected.items())],
    )
    return tuple(b.families)
