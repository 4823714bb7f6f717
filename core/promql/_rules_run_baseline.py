"""The rule group mfuscope.run_baseline: each run key's MFU and MFU waterfall over its past runs,
and the rules that set a running job against them (docs/compare.md, "A live baseline across
runs").

A run is a job (its `job` label); its run key (`mfuscope_run_info{job, run_key}`, exported by the
collector) says which runs are the same workload. The group records each running job's model
FLOPs and peak FLOP-seconds of the last 5 min, and its waterfall slices, labelled with its key;
sampled every 5 min (subqueries aligned to 5 min, then to 1 h, so the samples tile the run's
life and 30 days cost 720 points a series), those records sum to every recent run's totals,
which stay in the store after the run ends. A job's baseline is its key's totals less its own:
the other runs' MFU as a ratio of sums (exact, like every job-level ratio), and their waterfall
slices as a mean over their running time (a run's slices weigh by the 5 min samples it ran). A
key's first run has nothing left once its own totals are taken out, so it has no baseline.
"""

from __future__ import annotations

from mfuscope.core.promql import names as n
from mfuscope.core.promql.quantities import RUN_INFO
from mfuscope.core.promql.rules_file import Group, Rule
from mfuscope.core.promql.syntax import by_clause, positive, total

__all__ = ["run_baseline_group", "run_baseline_rules"]

_PIECE_S = 300  # each record is the 5 min before it, and the first subquery steps by 5 min
_MEMORY = "30d"  # how far back a key's past runs count (the store must keep the records as long)
_RUNNING_15M = "job:mfuscope_running_seconds:increase15m"
_SLICE = ("component", "axis", "tier")


def _keyed(expr: str) -> str:
    """`expr` (by job) labelled with the job's run key; jobs without one are left out. Ranks
    whose keys differ (pipeline stages counting different FLOPs per step, without a user's key)
    would give a job several: one is taken, so the join never fails for every other job."""
    keys = total(RUN_INFO, ("job", "run_key"), "max")
    return f"{expr} * on (job) group_left (run_key) topk by (job) (1, {keys})"


def _hourly(function: str, series: str) -> str:
    """`function` over the 12 five-minute samples of the last hour."""
    return f"{function}({series}[1h:5m])"


def _monthly(series: str) -> str:
    """The sum of the hourly samples over the memory: every hour the run lived, once."""
    return f"sum_over_time({series}[{_MEMORY}:1h])"


def _others(series: str, key: tuple[str, ...]) -> str:
    """Per (job, key...): the key's sum of `series` over every job less this job's own."""
    return f"({total(series, key)} - on {by_clause(key)} group_right {series})"


def run_baseline_group() -> Group:
    key = ("run_key",)
    slice_key = ("run_key", *_SLICE)
    running_now = f"on (job) {n.MFU_5M}"
    return Group(
        "mfuscope.run_baseline",
        (
            Rule(
                n.RUN_MODEL_FLOPS_5M,
                f"{_keyed(n.MODEL_FLOPS_5M)} * {_PIECE_S}",
                "Per run (job) and its run key, the model FLOPs and the peak FLOP-seconds of "
                "the 5 min before each evaluation; their 5 min samples summed per hour, and the "
                "hours over 30 days: each run's totals, present for 30 days after it ends.",
            ),
            Rule(n.RUN_PEAK_FLOP_SECONDS_5M, f"{_keyed(n.PEAK_FLOP_SECONDS_5M)} * {_PIECE_S}"),
            Rule(n.RUN_MODEL_FLOPS_1H, _hourly("sum_over_time", n.RUN_MODEL_FLOPS_5M)),
            Rule(n.RUN_PEAK_FLOP_SECONDS_1H, _hourly("sum_over_time", n.RUN_PEAK_FLOP_SECONDS_5M)),
            Rule(n.RUN_MODEL_FLOPS_30D, _monthly(n.RUN_MODEL_FLOPS_1H)),
            Rule(n.RUN_PEAK_FLOP_SECONDS_30D, _monthly(n.RUN_PEAK_FLOP_SECONDS_1H)),
            Rule(
                n.MFU_RUN_BASELINE,
                f"{_others(n.RUN_MODEL_FLOPS_30D, key)} / "
                f"{positive(_others(n.RUN_PEAK_FLOP_SECONDS_30D, key))} and {running_now}",
                "Per running job: the MFU of its key's other runs, Σ model FLOPs / Σ peak "
                "FLOP-seconds over them (docs/definitions.md#job-mfu). Absent for a key's first "
                "run (nothing is left once the job's own totals are taken out).",
            ),
            Rule(
                n.RUN_WATERFALL_5M,
                _keyed(
                    f'(label_replace({n.EXPOSED_COMM_AXIS_TIER_5M}, "component", "exposed_comm",'
                    f' "", "") or {n.WATERFALL_5M}{{component!="exposed_comm"}})'
                ),
                "The same for the MFU waterfall: each run's slices over 5 min (exposed "
                "communication per axis and tier, as the regression alert's slices), the sum "
                "and the count of their 5 min samples per hour and over 30 days, and per running "
                "job the mean of its key's other runs' samples.",
            ),
            Rule(n.RUN_WATERFALL_SUM_1H, _hourly("sum_over_time", n.RUN_WATERFALL_5M)),
            Rule(n.RUN_WATERFALL_COUNT_1H, _hourly("count_over_time", n.RUN_WATERFALL_5M)),
            Rule(n.RUN_WATERFALL_SUM_30D, _monthly(n.RUN_WATERFALL_SUM_1H)),
            Rule(n.RUN_WATERFALL_COUNT_30D, _monthly(n.RUN_WATERFALL_COUNT_1H)),
            Rule(
                n.WATERFALL_RUN_BASELINE,
                f"{_others(n.RUN_WATERFALL_SUM_30D, slice_key)} / "
                f"{positive(_others(n.RUN_WATERFALL_COUNT_30D, slice_key))} and {running_now}",
            ),
        ),
        comment=(
            "The live baseline across runs: each run key's MFU and waterfall over its past runs "
            "(other jobs of the same key in the last 30 days), for MFUScopeBelowRunBaseline. "
            "The store must keep these records 30 days (docs/compare.md)."
        ),
    )


def run_baseline_rules() -> tuple[Rule, ...]:
    """The running job against its key's baseline, evaluated with the regression rules (after
    `job:mfuscope_running_seconds:increase15m`)."""
    return (
        Rule(
            n.MFU_BELOW_RUN_BASELINE,
            f"(1 - {n.MFU_INCREASE_15M} / on (job) group_left (run_key)"
            f" ({n.MFU_RUN_BASELINE} > 0)) and on (job) ({_RUNNING_15M} >= 600)",
            "Fraction of its run key's baseline MFU a running job lacks over the last 15 min "
            "(0.15 = 15 % below the key's other runs); only while it ran at least 10 of them.",
        ),
        Rule(
            n.WATERFALL_RUN_BASELINE_GROWTH,
            f"{n.WATERFALL_INCREASE_15M} - (max without (run_key) ({n.WATERFALL_RUN_BASELINE})"
            f" or {n.WATERFALL_INCREASE_15M} * 0) and on (job) {n.MFU_BELOW_RUN_BASELINE}",
            "Growth of each waterfall slice over the key's baseline, in fractions of step "
            "time, for the jobs compared; a slice the other runs lacked grew from 0.",
        ),
    )
