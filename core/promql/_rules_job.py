"""The recording rules of group mfuscope.job for utilisation, step time, the step decomposition
with the MFU waterfall, and stragglers (the collectives' rules: `_rules_collectives`)."""

from __future__ import annotations

from mfuscope.core.promql import names as n
from mfuscope.core.promql import quantities as q
from mfuscope.core.promql.rules_file import Rule, Section
from mfuscope.core.promql.syntax import ratio, selector, total

__all__ = [
    "compute_fraction",
    "step_rules",
    "straggler_rules",
    "utilisation_rules",
    "waterfall_rules",
]

JOB = ("job",)
# Stragglers are compared per sidecar (or per rank with per-rank labels): `host` is the node (the
# scrape configuration sets it, deploy/fleet/edge-prometheus.yml).
_SIDECAR = ("job", "instance", "host", "rank")
_OWN_STEP_SECONDS = "instance:mfuscope_own_step_seconds:ratio_rate5m"
_OWN_STEP_MEDIAN = "job:mfuscope_own_step_seconds:median_rate5m"
_STEP_DURATION_BUCKETS = "mfuscope_step_duration_seconds_bucket"


def _rate(counter: str, by: tuple[str, ...] = JOB) -> str:
    return total(q.RATE_5M.of(counter), by)


def compute_fraction(fractions: str = n.STEP_FRACTION_5M) -> str:
    """``f_compute`` of each job from the recorded bucket fractions."""
    compute = selector(fractions, 'component="compute"')
    return f"sum without (component) ({compute})"


def utilisation_rules() -> list[Rule | Section]:
    return [
        Section(
            "utilisation (docs/definitions.md#job-mfu)",
            "MFU = model FLOPs / (peak FLOP/s × step time), a ratio of two counters that both grow "
            "only while steps run: mfuscope_peak_flop_seconds_total adds each rank's dense peak × "
            "step wall time. The ratio of their increases is right whatever part of the window the "
            "job ran (its first minutes, a pause, its end); rate(FLOPs) / peak FLOP/s divides a "
            "young or finished job's FLOPs by the whole window and reads low. Extrapolation at the "
            "window's edges scales both increases alike (same target, same scrapes), so it "
            "cancels.",
        ),
        Rule(n.MODEL_FLOPS_5M, _rate(q.MODEL_FLOPS)),
        Rule("job:mfuscope_hardware_flops:rate5m", _rate(q.HARDWARE_FLOPS)),
        Rule(n.PEAK_FLOP_SECONDS_5M, _rate(q.PEAK_FLOP_SECONDS)),
        Rule(n.PEAK_FLOPS_SUM, total(q.PEAK_FLOPS, JOB)),
        Rule(n.MFU_5M, q.mfu(q.RATE_5M)),
        Rule(
            n.HFU_5M,
            q.hfu(q.RATE_5M),
            "HFU counts recomputation (activation checkpointing) as useful work too: HFU >= MFU.",
        ),
    ]


def _step_quantile(quantile: str) -> Rule:
    buckets = total(q.RATE_5M.of(_STEP_DURATION_BUCKETS), ("job", "le"))
    return Rule(
        "job_quantile:mfuscope_step_duration_seconds:histogram_quantile_rate5m",
        f"histogram_quantile({quantile}, {buckets})",
        labels={"quantile": quantile},
    )


def step_rules() -> list[Rule | Section]:
    return [
        Section("step time"),
        Rule(
            "job:mfuscope_steps:rate5m",
            _rate(q.STEPS),
            "Rank-steps per second (a job of N ranks at s steps/s gives N × s).",
        ),
        Rule("job:mfuscope_step_duration_seconds:mean5m", q.mean_step_seconds(q.RATE_5M)),
        _step_quantile("0.5"),
        _step_quantile("0.99"),
    ]


def waterfall_rules() -> list[Rule | Section]:
    exposed = 'component="exposed_comm"'
    return [
        Section(
            "step decomposition (docs/definitions.md#step-buckets)",
            "The denominator is the sum over all components, not mfuscope_step_seconds_total: a "
            "step reported before the first profiled window carries no components, and counting "
            "its wall time would bias every fraction low. Components of a step sum to its wall "
            "time, so the fractions of one job sum to 1.",
        ),
        Rule(
            "job_component:mfuscope_step_component_seconds:rate5m",
            _rate(q.COMPONENT_SECONDS, ("job", "component")),
        ),
        Rule(n.STEP_FRACTION_5M, q.bucket_fraction(q.RATE_5M, per=("component",))),
        Rule(
            n.EXPOSED_COMM_AXIS_TIER_5M,
            q.bucket_fraction(q.RATE_5M, per=("axis", "tier"), part=exposed),
        ),
        Rule(n.EXPOSED_COMM_5M, q.bucket_fraction(q.RATE_5M, part=exposed)),
        Rule(
            n.BUBBLE_FRACTION_5M,
            q.bucket_fraction(q.RATE_5M, part=q.bubble_matcher()),
            "bubble = bubble_pipeline + bubble_idle (docs/definitions.md#bubble).",
        ),
        Rule(
            n.OVERLAPPED_COMM_5M,
            q.step_fraction(q.OVERLAPPED_COMM_SECONDS, q.RATE_5M),
            "Communication hidden under compute, as a fraction of step time (beside the buckets).",
        ),
        Rule(
            n.KERNEL_EFFICIENCY_5M,
            q.kernel_efficiency(n.MFU_5M, compute_fraction()),
            "The MFU waterfall (docs/definitions.md#mfu-waterfall): 1 - MFU = f_exposed_comm + "
            "f_bubble + f_recompute + f_other + f_compute × (1 - kernel_efficiency), with "
            "kernel_efficiency = MFU / f_compute, so the last slice is f_compute - MFU.",
        ),
        Rule(
            n.ELEMENTWISE_5M,
            q.elementwise_slice(q.RATE_5M, n.MFU_5M),
            "The unfused / memory-bound kernels' slice (f_elementwise, "
            "docs/definitions.md#unfused-and-memory-bound-kernels): compute time in kernels of "
            "class elementwise_norm_reduce over step time, from the profiled windows' class split "
            "scaled to every step like the buckets; 0 while no agent sends a split.",
        ),
        Rule(
            n.KERNEL_INEFFICIENCY_5M,
            q.kernel_inefficiency(compute_fraction(), n.MFU_5M, n.ELEMENTWISE_5M),
            "The rest of the kernel slice: f_compute - MFU - f_elementwise, so that f_compute × "
            "(1 - kernel_efficiency) = f_elementwise + this. Not clamped at 0, like the core "
            "waterfall: a negative slice means the FLOPs per step are overstated or the peak "
            "understated (docs/definitions.md#kernel-efficiency, docs/operations.md).",
        ),
        Rule(
            n.WATERFALL_5M,
            q.waterfall(
                selector(n.STEP_FRACTION_5M, 'component!="compute"'),
                n.ELEMENTWISE_5M,
                n.KERNEL_INEFFICIENCY_5M,
            ),
            "Every slice of 1 - MFU in one series per slice (component: each bucket but compute, "
            "elementwise, kernel_inefficiency): with MFU they sum to 1, and a new bucket shows "
            "here without a new rule. Built from the series above, which are evaluated anyway, "
            "rather than from the counters again: it runs every evaluation on every job.",
        ),
    ]


def straggler_rules() -> list[Rule | Section]:
    return [
        Section("stragglers"),
        Rule("job:mfuscope_straggler_ratio:max", total("mfuscope_straggler_ratio", JOB, "max")),
        Rule(
            _OWN_STEP_SECONDS,
            q.own_step_seconds(q.RATE_5M, _SIDECAR),
            "Job-wide stragglers across collectors. One collector compares only the ranks it sees "
            "(8 on a per-node sidecar), so a slow node among hundreds is compared with its job "
            "here: each sidecar's (or, with per-rank labels, each rank's) own time per rank-step "
            "(docs/definitions.md#own-time: step time less exposed communication and the pipeline "
            "bubble, where a rank waits on others) = its own share of step time × its mean step "
            "time, against the median over all of the job's sidecars. `host` is the node (the "
            "scrape configuration sets it, deploy/fleet/edge-prometheus.yml).",
        ),
        Rule(_OWN_STEP_MEDIAN, f"quantile by (job) (0.5, {_OWN_STEP_SECONDS})"),
        Rule(
            "instance:mfuscope_own_step_seconds:ratio_to_median_rate5m",
            ratio(_OWN_STEP_SECONDS, _OWN_STEP_MEDIAN, on=JOB),
        ),
    ]
