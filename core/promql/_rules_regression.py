"""The rule groups mfuscope.regression (the job against its own baseline, with the MFU waterfall's
slices now and then) and mfuscope.restarts (redone work)."""

from __future__ import annotations

from mfuscope.core.promql import names as n
from mfuscope.core.promql import quantities as q
from mfuscope.core.promql._rules_run_baseline import run_baseline_rules
from mfuscope.core.promql.rules_file import Group, Rule
from mfuscope.core.promql.syntax import ratio, total

__all__ = ["regression_group", "restarts_group"]

JOB = ("job",)
_RUNNING_15M = "job:mfuscope_running_seconds:increase15m"
_RUNNING_6H = "job:mfuscope_running_seconds:baseline6h"
_USEFUL_STEPS = "job:mfuscope_useful_steps:rate5m"
_RERUN_STEPS = "mfuscope_rerun_steps_total"


def regression_group() -> Group:
    return Group(
        "mfuscope.regression",
        (
            Rule(n.MFU_INCREASE_15M, q.mfu(q.INCREASE_15M)),
            Rule(n.MFU_BASELINE_6H, q.mfu(q.INCREASE_6H_BASELINE)),
            Rule(
                _RUNNING_15M,
                q.running_seconds(q.INCREASE_15M),
                "How long the job ran in each range, s: peak FLOP-seconds over the live ranks' "
                "peak FLOP/s (every rank that steps for t seconds adds peak × t). Absent once no "
                "rank is live.",
            ),
            Rule(_RUNNING_6H, q.running_seconds(q.INCREASE_6H_BASELINE)),
            Rule(
                n.MFU_REGRESSION,
                f"(1 - {n.MFU_INCREASE_15M} / ({n.MFU_BASELINE_6H} > 0))"
                f" and on (job) ({_RUNNING_15M} >= 600)"
                f" and on (job) ({_RUNNING_6H} >= 3600)",
                "Fraction of the baseline MFU lost (0.2 = 20 % below the job's own baseline), only "
                "once the job has a baseline (1 h of running in it) and enough of the last 15 min "
                "is running time (10 min) for the comparison to mean something.",
            ),
            Rule(
                n.WATERFALL_INCREASE_15M,
                q.waterfall_slices(q.INCREASE_15M, n.MFU_INCREASE_15M),
                "The MFU waterfall slices (1 - MFU = Σ slices, docs/definitions.md#mfu-waterfall): "
                "each non-compute bucket of the step decomposition (exposed_comm per axis and "
                "tier, bubble_pipeline, bubble_idle, recompute, other) as a ratio of "
                "component-second increases to step seconds, plus elementwise (while agents send "
                "a kernel-class split) and kernel_inefficiency = compute fraction - MFU - "
                "elementwise, never clamped. The alert names the slice that grew most.",
            ),
            Rule(
                n.WATERFALL_BASELINE_6H,
                q.waterfall_slices(q.INCREASE_6H_BASELINE, n.MFU_BASELINE_6H),
            ),
            Rule(
                n.WATERFALL_GROWTH,
                f"{n.WATERFALL_INCREASE_15M} - ({n.WATERFALL_BASELINE_6H}"
                f" or {n.WATERFALL_INCREASE_15M} * 0)",
                "Growth of each slice, in fractions of step time; a slice absent from the "
                "baseline (a new axis or tier) grew from 0.",
            ),
            *run_baseline_rules(),
        ),
        comment=(
            "The regression alert: the job now (15 min) against its own baseline (the 6 h that "
            "end 30 min ago, so the drop being measured stays out of its baseline). Every figure "
            "is a ratio of counter increases over the same range, so time the job did not run "
            "(start, pause, end, a restart of an agent or of the collector) weighs nothing: no "
            "sample is ever averaged over idle time. Rules of one group run in order, so later "
            "rules read the earlier ones' fresh samples (on vmalert the previous evaluation's: "
            "over 15 min and 6 h windows that moves a figure by at most interval / window)."
        ),
    )


def restarts_group() -> Group:
    steps = total(q.RATE_5M.of(q.STEPS), JOB)
    reruns = total(q.RATE_5M.of(_RERUN_STEPS), JOB)
    # A collector too old to export the rerun counter: nothing redone, rather than no data.
    redone = f"({reruns} or 0 * {steps})"
    restarts = total("increase(mfuscope_job_restarts_total[1h])", JOB, "max")
    return Group(
        "mfuscope.restarts",
        (
            Rule("job:mfuscope_rerun_steps:rate5m", reruns),
            Rule(
                _USEFUL_STEPS,
                f"{steps} - {redone}",
                "Rank-steps per second that advanced training. A collector too old to export the "
                'rerun counter reads as "nothing redone" rather than as no data.',
            ),
            Rule(
                "job:mfuscope_useful_steps:ratio_rate5m",
                f"1 - {ratio(redone, steps)}",
                "Step goodput: the fraction of the job's step work that was not redone, 0..1. "
                "Written as 1 - redone / all, not useful / all: an engine that reads the two rates "
                "from different samples (VictoriaMetrics while the newest samples arrive) still "
                "gives exactly 1 when nothing was redone, and never more than 1.",
            ),
            Rule(
                "job:mfuscope_job_restarts:increase1h",
                f"round({restarts})",
                "Restarts in the last hour. Every collector holding some of the job's ranks sees "
                "each restart, so collectors are combined with max, not sum. increase() "
                "extrapolates; round() gives back the whole number of restarts the counter went "
                "up by.",
            ),
        ),
        comment=(
            "Restarts and redone work. A job that crashes and resumes from a checkpoint runs the "
            "steps since that checkpoint again: real work on real devices that advances the model "
            "no further. mfuscope_steps_total counts those steps too (the devices were busy); "
            "mfuscope_rerun_steps_total counts them once more as redone, so useful = steps - "
            'rerun (docs/collector.md "Restarts").'
        ),
    )
