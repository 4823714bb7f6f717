"""The PromQL of each job-level quantity, written once: MFU, HFU, the step buckets' fractions, the
MFU waterfall's slices, kernel efficiency, bus bandwidth and its efficiency.

The recording rules (`mfuscope.core.promql.recording`) and both dashboard generators build their
queries with these functions, so a rule and a panel cannot disagree on a formula; a test scans the
shipped rules and dashboards for any formula over these counters that did not come from here.
Every quantity is a ratio of sums of counter changes over one window, never a mean of ratios
(docs/definitions.md#job-mfu), so it is exact across ranks, nodes and collectors.

Arguments: `window` (rate over 5 min, increase over 15 min, ...), `by` the labels the result keeps
(``("job",)`` for the rules; ``()`` on the one-job dashboard), `matchers` label matchers applied
to every counter read (a dashboard's ``job=~"$job"``).
"""

from __future__ import annotations

from collections.abc import Sequence

from mfuscope.core.promql.syntax import Window, joined_matchers, ratio, selector, total
from mfuscope.core.vocabulary import (
    BUBBLE_COMPONENTS,
    ELEMENTWISE_SLICE,
    KERNEL_CLASSES,
    KERNEL_INEFFICIENCY_SLICE,
    WAITING_COMPONENTS,
)

__all__ = [
    "BUS_SECONDS",
    "BUS_SIZED_BYTES",
    "COLLECTIVE_BYTES",
    "COLLECTIVE_CALLS",
    "COLLECTIVE_OVERLAPPED_SECONDS",
    "COLLECTIVE_PROFILED_SECONDS",
    "COMPONENT_SECONDS",
    "COMPUTE_CLASS_SECONDS",
    "DASHBOARD_RATE",
    "FORMULA_INPUTS",
    "HARDWARE_FLOPS",
    "INCREASE_1H",
    "INCREASE_6H_BASELINE",
    "INCREASE_15M",
    "JOB_PEAK_FLOP_SECONDS",
    "JOB_RANK_SECONDS",
    "MODEL_FLOPS",
    "OVERLAPPED_COMM_SECONDS",
    "PEAK_FLOPS",
    "PEAK_FLOP_SECONDS",
    "RATE_5M",
    "RUN_INFO",
    "STEPS",
    "STEP_SECONDS",
    "TIER_SPEC",
    "USEFUL_MODEL_FLOPS",
    "bubble_matcher",
    "bucket_fraction",
    "busbw",
    "busbw_efficiency",
    "collective_overlap",
    "effective_mfu",
    "elementwise_fraction",
    "elementwise_slice",
    "hfu",
    "job_time_share",
    "kernel_efficiency",
    "kernel_inefficiency",
    "mean_message_bytes",
    "mean_step_seconds",
    "mfu",
    "own_step_seconds",
    "running_seconds",
    "step_fraction",
    "step_seconds",
    "tier_spec",
    "utilization",
    "waterfall",
    "waterfall_slices",
]

JOB = ("job",)
# The windows the rules and dashboards use.
RATE_5M = Window("rate", "5m")
INCREASE_15M = Window("increase", "15m")
# The job-time ledger's window: the job now against its budgets (MFUScopeJobTimeLost).
INCREASE_1H = Window("increase", "1h")
# The regression alert's baseline: the 6 h that end 30 min ago, so the drop stays out of it.
INCREASE_6H_BASELINE = Window("increase", "6h", "30m")
DASHBOARD_RATE = Window("rate", "$__rate_interval")

# The collector's counters these definitions read (docs/reference/metrics.md).
MODEL_FLOPS = "mfuscope_model_flops_total"
HARDWARE_FLOPS = "mfuscope_hardware_flops_total"
# Each rank's dense peak FLOP/s × the wall time of each step it reports: what could have been done.
PEAK_FLOP_SECONDS = "mfuscope_peak_flop_seconds_total"
COMPONENT_SECONDS = "mfuscope_step_component_seconds_total"
COMPUTE_CLASS_SECONDS = "mfuscope_compute_class_seconds_total"
OVERLAPPED_COMM_SECONDS = "mfuscope_overlapped_comm_seconds_total"
STEP_SECONDS = "mfuscope_step_seconds_total"
STEPS = "mfuscope_steps_total"
PEAK_FLOPS = "mfuscope_peak_flops"
COLLECTIVE_BYTES = "mfuscope_collective_bytes_total"
COLLECTIVE_CALLS = "mfuscope_collective_calls_total"
COLLECTIVE_OVERLAPPED_SECONDS = "mfuscope_collective_overlapped_seconds_total"
COLLECTIVE_PROFILED_SECONDS = "mfuscope_collective_profiled_seconds_total"
# busbw divides counters of one source: the bus bytes and the seconds of exactly the calls whose
# size and group size are known (docs/definitions.md#aggregating-busbw).
BUS_SIZED_BYTES = "mfuscope_collective_sized_bus_bytes_total"
BUS_SECONDS = "mfuscope_collective_sized_seconds_total"
TIER_SPEC = "mfuscope_tier_peak_bandwidth_bytes_per_second"
# The job-time ledger (docs/definitions.md#job-time-ledger): rank-seconds per category, the model
# FLOPs of the steps not redone, and the peak FLOP/s x every rank-second.
JOB_RANK_SECONDS = "mfuscope_job_rank_seconds_total"
USEFUL_MODEL_FLOPS = "mfuscope_useful_model_flops_total"
JOB_PEAK_FLOP_SECONDS = "mfuscope_job_peak_flop_seconds_total"
# Value 1 per job, label run_key: which runs are the same workload (the live baseline across runs).
RUN_INFO = "mfuscope_run_info"
_ELEMENTWISE_CLASS = KERNEL_CLASSES[2]  # elementwise_norm_reduce
# The counters whose ratios are the quantities above: a rule or a panel that reads one of them
# does so through a function of this module (the test of the shipped files checks it).
FORMULA_INPUTS: frozenset[str] = frozenset(
    {
        MODEL_FLOPS,
        HARDWARE_FLOPS,
        PEAK_FLOP_SECONDS,
        COMPONENT_SECONDS,
        COMPUTE_CLASS_SECONDS,
        OVERLAPPED_COMM_SECONDS,
        STEP_SECONDS,
        BUS_SIZED_BYTES,
        BUS_SECONDS,
        TIER_SPEC,
        COLLECTIVE_CALLS,
        COLLECTIVE_OVERLAPPED_SECONDS,
        COLLECTIVE_PROFILED_SECONDS,
        JOB_RANK_SECONDS,
        USEFUL_MODEL_FLOPS,
        JOB_PEAK_FLOP_SECONDS,
    }
)


def utilization(flops: str, possible_flops: str) -> str:
    """FLOPs done over the FLOPs the devices could have done (both summed alike): the one form of
    MFU and HFU (`mfuscope.core.mfu.utilization`); no sample where nothing could have been done."""
    return ratio(flops, possible_flops)


def _flop_ratio(flops: str, window: Window, by: Sequence[str], matchers: str) -> str:
    return utilization(
        total(window.of(flops, matchers), by), total(window.of(PEAK_FLOP_SECONDS, matchers), by)
    )


def mfu(window: Window, by: Sequence[str] = JOB, matchers: str = "") -> str:
    """MFU = Σ model FLOPs / Σ peak FLOP-seconds over the window (docs/definitions.md#job-mfu).
    Both counters grow only while steps run, so it is right over any part of a job's life."""
    return _flop_ratio(MODEL_FLOPS, window, by, matchers)


def hfu(window: Window, by: Sequence[str] = JOB, matchers: str = "") -> str:
    """HFU: MFU with recomputation counted as work (hardware FLOPs); HFU >= MFU."""
    return _flop_ratio(HARDWARE_FLOPS, window, by, matchers)


def _changed(counter: str, window: Window | None, matchers: str) -> str:
    """The counter's change over `window`, or its value since it started (None: the job's life
    as the collectors saw it)."""
    return selector(counter, matchers) if window is None else window.of(counter, matchers)


def effective_mfu(window: Window | None, by: Sequence[str] = JOB, matchers: str = "") -> str:
    """Effective MFU = Σ useful model FLOPs / Σ peak FLOP/s x every rank-second of the job,
    startup and down included (docs/definitions.md#effective-mfu); `window` None: over the
    counters' whole life."""
    return utilization(
        total(_changed(USEFUL_MODEL_FLOPS, window, matchers), by),
        total(_changed(JOB_PEAK_FLOP_SECONDS, window, matchers), by),
    )


def job_time_share(
    window: Window, by: Sequence[str] = JOB, matchers: str = "", part: str = ""
) -> str:
    """Each job-time category's share of the job's rank-seconds over the window, per
    ``category`` (`part` selects categories of the numerator); a job's shares sum to 1."""
    numerator = total(
        window.of(JOB_RANK_SECONDS, joined_matchers(matchers, part)), (*by, "category")
    )
    denominator = total(window.of(JOB_RANK_SECONDS, matchers), by)
    return ratio(numerator, denominator, on=by)


def step_seconds(window: Window, by: Sequence[str] = JOB, matchers: str = "") -> str:
    """Step time as the sum over all buckets (docs/definitions.md#bucket-invariant), not the step
    counter: a step reported before the first profiled window carries no buckets, and counting
    its wall time would bias every fraction low."""
    return total(window.of(COMPONENT_SECONDS, matchers), by)


def step_fraction(
    counter: str,
    window: Window,
    by: Sequence[str] = JOB,
    per: Sequence[str] = (),
    matchers: str = "",
    part: str = "",
) -> str:
    """The seconds of `counter{part}` as a fraction of step time, kept per `by` and `per` (the
    step time only per `by`). `part` selects the numerator only; `matchers` both sides."""
    numerator = total(window.of(counter, joined_matchers(matchers, part)), (*by, *per))
    return ratio(numerator, step_seconds(window, by, matchers), on=by if per else None)


def bucket_fraction(
    window: Window,
    by: Sequence[str] = JOB,
    per: Sequence[str] = (),
    matchers: str = "",
    part: str = "",
) -> str:
    """Fraction of step time in the buckets `part` selects (all by default), per `per`; the
    fractions of a job's buckets sum to 1 (docs/definitions.md#step-buckets)."""
    return step_fraction(COMPONENT_SECONDS, window, by, per, matchers, part)


def bubble_matcher() -> str:
    """The component matcher of the bubble, ``bubble_pipeline`` + ``bubble_idle``."""
    return f'component=~"{"|".join(BUBBLE_COMPONENTS)}"'


def elementwise_fraction(window: Window, by: Sequence[str] = JOB, matchers: str = "") -> str:
    """``f_elementwise``: compute time in unfused / memory-bound kernels (class
    ``elementwise_norm_reduce``) over step time
    (docs/definitions.md#unfused-and-memory-bound-kernels); no sample while no agent reports a
    class split."""
    return step_fraction(
        COMPUTE_CLASS_SECONDS, window, by, matchers=matchers, part=f'class="{_ELEMENTWISE_CLASS}"'
    )


def elementwise_slice(window: Window, mfu_expr: str, by: Sequence[str] = JOB) -> str:
    """The waterfall's ``f_elementwise`` slice: `elementwise_fraction`, or 0 (for each job that
    has `mfu_expr`, the MFU of the same window) while no class split is reported, when the whole
    kernel slice is kernel inefficiency."""
    return f"{elementwise_fraction(window, by)} or 0 * {mfu_expr}"


def kernel_efficiency(mfu_expr: str, compute_fraction: str) -> str:
    """``MFU / f_compute``: model FLOP/s while computing over the peak
    (docs/definitions.md#kernel-efficiency); no sample without compute time."""
    return ratio(mfu_expr, compute_fraction)


def kernel_inefficiency(
    compute_fraction: str, mfu_expr: str, elementwise: str, on: Sequence[str] = JOB
) -> str:
    """The kernel slice less its unfused part: ``f_compute - MFU - f_elementwise``, where
    ``f_compute - MFU = f_compute × (1 - kernel_efficiency)``. Never clamped: it is negative when
    the FLOPs are overcounted or the peak underestimated, and clamping would hide that and break
    the waterfall's sum (docs/definitions.md#kernel-efficiency)."""
    match = f"on ({', '.join(on)}) "
    return f"{compute_fraction} - {match}{mfu_expr} - {match}{elementwise}"


def waterfall(bucket_slices: str, elementwise: str, rest: str) -> str:
    """Every slice of ``1 - MFU`` as one vector labelled ``component``
    (docs/definitions.md#mfu-waterfall): `bucket_slices`, the fractions of each bucket but
    compute (labelled by bucket), then `elementwise` and `rest` (``kernel_inefficiency``),
    labelled here. With the MFU of the same window they sum to 1."""
    return (
        f"({bucket_slices})"
        f' or label_replace({elementwise}, "component", "{ELEMENTWISE_SLICE}", "", "")'
        f' or label_replace({rest}, "component", "{KERNEL_INEFFICIENCY_SLICE}", "", "")'
    )


def waterfall_slices(window: Window, mfu_expr: str, by: Sequence[str] = JOB) -> str:
    """`waterfall` over the window from the counters: each bucket but compute (``exposed_comm``
    also per ``axis`` and ``tier``), ``elementwise`` (while a class split is reported) and
    ``kernel_inefficiency``; `mfu_expr` is the MFU of the same window."""
    per = ("component", "axis", "tier")
    buckets = bucket_fraction(window, by, per, part='component!="compute"')
    elementwise = elementwise_fraction(window, by)
    compute = bucket_fraction(window, by, part='component="compute"')
    rest = kernel_inefficiency(
        compute, mfu_expr, f"({elementwise_slice(window, mfu_expr, by)})", by
    )
    return waterfall(buckets, elementwise, rest)


def mean_step_seconds(window: Window, by: Sequence[str] = JOB, matchers: str = "") -> str:
    """Mean step wall time: Σ step seconds / Σ steps (rank-steps)."""
    return ratio(
        total(window.of(STEP_SECONDS, matchers), by), total(window.of(STEPS, matchers), by)
    )


def own_step_seconds(window: Window, by: Sequence[str], matchers: str = "") -> str:
    """Own time per rank-step (docs/definitions.md#own-time): the share of step time outside the
    buckets in which a rank waits on its peers, times the mean step time."""
    waiting = "|".join(sorted(WAITING_COMPONENTS))
    own_share = bucket_fraction(window, by, matchers=matchers, part=f'component!~"{waiting}"')
    return f"{own_share} * {mean_step_seconds(window, by, matchers)}"


def running_seconds(window: Window, by: Sequence[str] = JOB) -> str:
    """How long the job ran in the window, s: peak FLOP-seconds over the live ranks' peak FLOP/s
    (every rank that steps for t seconds adds its peak × t); absent once no rank is live."""
    return ratio(total(window.of(PEAK_FLOP_SECONDS), by), total(PEAK_FLOPS, by))


def busbw(window: Window, by: Sequence[str], matchers: str = "") -> str:
    """Bus bandwidth of the calls in the window, bytes/s: Σ bus bytes / Σ seconds over the calls
    of known size and group size, summed across ranks, ops and time as `by` leaves them
    (docs/definitions.md#aggregating-busbw; `mfuscope.core.bandwidth.aggregate_busbw`)."""
    return ratio(
        total(window.of(BUS_SIZED_BYTES, matchers), by),
        total(window.of(BUS_SECONDS, matchers), by),
    )


def mean_message_bytes(window: Window, by: Sequence[str]) -> str:
    """Mean size S per collective call, bytes (reads low while calls of unknown size exist)."""
    return ratio(total(window.of(COLLECTIVE_BYTES), by), total(window.of(COLLECTIVE_CALLS), by))


def collective_overlap(window: Window, by: Sequence[str]) -> str:
    """Share of collective time hidden under compute: both counters from profiled windows."""
    return ratio(
        total(window.of(COLLECTIVE_OVERLAPPED_SECONDS), by),
        total(window.of(COLLECTIVE_PROFILED_SECONDS), by),
    )


def tier_spec(by: Sequence[str] = ("job", "axis", "tier"), matchers: str = "") -> str:
    """The spec rate of each (axis, tier), bytes/s. Every collector of a job exports the same spec
    for an (axis, tier), so collectors are combined with max, never summed."""
    return total(selector(TIER_SPEC, matchers), by, operator="max")


def busbw_efficiency(busbw_expr: str, on: Sequence[str] = ("job", "axis", "tier")) -> str:
    """busbw / the spec of its (axis, tier) (docs/definitions.md#bandwidth-efficiency;
    `mfuscope.core.bandwidth.busbw_efficiency`); no sample where the spec is unknown (0)."""
    return ratio(busbw_expr, tier_spec(on), on=on)
