"""Job: MFU/HFU, where the job's time went (effective MFU), step decomposition, MFU waterfall,
step time, stragglers, hangs and arrival skew, restarts and redone work, telemetry health."""

from __future__ import annotations

from typing import Any

from _common import (
    AMBER,
    BLUE,
    GREEN,
    JOB,
    RED,
    Query,
    Row,
    bargauge_panel,
    build_dashboard,
    stat_panel,
    table_panel,
    timeseries_panel,
)
from breakdown_age import breakdown_age_panel, breakdown_spread_panel
from fleet_dashboard import EXPOSED_BANDS, MFU_BANDS, MFU_MEANING, REGRESSION_BANDS
from hangs_row import hangs_row
from hardware_rows import hardware_rows
from job_time_row import job_time_row
from mfuscope.core.promql import names as n
from mfuscope.core.promql import quantities as q

__all__ = ["UID", "build"]

UID = "mfuscope-job"

# Must match MFUScopeStragglerRank (1.2), MFUScopeAgentsSilent (90 s), MFUScopeJobStalled (120 s),
# MFUScopeJobRestarting (3 restarts in an hour).
STRAGGLER_BANDS = [(None, GREEN), (1.10, AMBER), (1.20, RED)]
REPORT_AGE_BANDS = [(None, GREEN), (30, AMBER), (90, RED), (120, "dark-red")]
RESTART_BANDS = [(None, GREEN), (1, AMBER), (3, RED)]

# The queries that follow the dashboard's time range: one job, over Grafana's rate interval.
_RATE = q.DASHBOARD_RATE
_ONE_JOB: tuple[str, ...] = ()

DECOMPOSITION_MEANING = (
    "Every instant of a step belongs to one bucket, in this order: compute (a compute kernel "
    "runs), recompute (only activation-recomputation kernels run), exposed_comm (no compute, a "
    "collective runs: waiting on the network, by axis/tier), other (only memcpy/memset), "
    "bubble_pipeline (pipeline p2p waiting beyond its ideal transfer time), bubble_idle (nothing "
    "runs: host-bound, data loader, waiting on a peer), instrumentation (the profiler's own "
    "start, step marks and stop on a profiled step: the live MFU's dips at window steps). From "
    "the profiled windows, scaled to every step. "
)


def _utilisation_row() -> Row:
    return Row(
        "Utilisation",
        [
            stat_panel(
                "MFU (5 min)",
                MFU_MEANING + "Red below 25 %, amber below 40 %.",
                "percentunit",
                Query(f"{n.MFU_5M}{{{JOB}}}"),
                thresholds=MFU_BANDS,
                width=3,
            ),
            stat_panel(
                "HFU (5 min)",
                "HFU = (model + recomputation FLOPs) per second / peak FLOP/s. HFU - MFU is the "
                "share spent recomputing activations.",
                "percentunit",
                Query(f"{n.HFU_5M}{{{JOB}}}"),
                thresholds=MFU_BANDS,
                width=3,
            ),
            stat_panel(
                "MFU lost vs own 6 h baseline",
                "1 - (MFU over the last 15 min) / (MFU over the 6 h ending 30 min ago), both over "
                "running time only. 0 = as good as usual; 0.2 = a fifth of the job's usual "
                "efficiency is gone. Amber from 10 %, red from 25 % (MFUScopeMFURegression). "
                "Empty until the job has run 1 h 30 min, and while it ran under 10 of the last "
                "15 min.",
                "percentunit",
                Query(f"{n.MFU_REGRESSION}{{{JOB}}}"),
                thresholds=REGRESSION_BANDS,
                width=3,
            ),
            stat_panel(
                "Model FLOP/s (5 min)",
                "Model FLOPs per second of all ranks together (the MFU numerator).",
                "flops",
                Query(f"{n.MODEL_FLOPS_5M}{{{JOB}}}"),
                width=3,
            ),
            stat_panel(
                "Ranks reporting",
                "Ranks of this job that report to a collector now. Fewer than the job's world "
                "size: some ranks never reported or went silent (forgotten after 5 min).",
                "none",
                Query(f"sum(mfuscope_ranks{{{JOB}}})"),
                decimals=0,
                width=3,
            ),
            stat_panel(
                "Ranks with unknown peak",
                "Ranks whose device has no known dense peak FLOP/s: they are left out of the MFU "
                "denominator, so MFU is incomplete. Fix: pass the peak to the agent.",
                "none",
                Query(f"sum(mfuscope_peak_flops_unknown_ranks{{{JOB}}})"),
                thresholds=[(None, GREEN), (1, AMBER)],
                decimals=0,
                width=3,
            ),
            stat_panel(
                "TP group spans hosts",
                "YES when a tensor-parallel (tp) group has ranks on more than one host: its "
                "per-layer collectives then cross the inter-node network instead of NVLink "
                "(MFUScopeTPSpansHosts). A placement/config error.",
                "none",
                Query(f"max(mfuscope_tp_spans_hosts{{{JOB}}})"),
                thresholds=[(None, GREEN), (1, RED)],
                mappings={"0": ("no", GREEN), "1": ("YES", RED)},
                width=3,
            ),
            stat_panel(
                "Last report age now",
                "Seconds since the collector last heard from the most silent rank. Reports "
                "arrive every few seconds; red from 90 s (MFUScopeAgentsSilent), dark red from "
                "120 s (MFUScopeJobStalled when every rank is silent).",
                "s",
                Query(f"max(mfuscope_last_report_age_seconds{{{JOB}}})"),
                thresholds=REPORT_AGE_BANDS,
                width=3,
            ),
            timeseries_panel(
                "MFU and HFU",
                MFU_MEANING + "HFU adds recomputation FLOPs. Both are ratios of counter increases "
                "(FLOPs over peak FLOP-seconds), so they read right from a job's first minutes and "
                "ignore pauses. Dashed: the job's own baseline (MFU over its running time in the "
                "6 h ending 30 min ago) that the regression alert compares against, and its run "
                "key's baseline (the MFU of earlier runs of the same workload in the last 30 "
                "days) that MFUScopeBelowRunBaseline compares against; empty on a key's first "
                "run.",
                "percentunit",
                [
                    Query(q.mfu(_RATE, _ONE_JOB, JOB), "MFU"),
                    Query(q.hfu(_RATE, _ONE_JOB, JOB), "HFU"),
                    Query(f"{n.MFU_BASELINE_6H}{{{JOB}}}", "baseline MFU (6 h)"),
                    Query(
                        f"max by (run_key) (last_over_time({n.MFU_RUN_BASELINE}{{{JOB}}}[10m]))",
                        "baseline MFU (earlier runs of run key {{run_key}})",
                    ),
                ],
                min_value=0,
                dashed_series_regex="^baseline.*",
                width=24,
            ),
        ],
    )


def _decomposition_row() -> Row:
    # MFU and every slice of 1 - MFU, one series per slice (the recorded waterfall iterates the
    # buckets of core/vocabulary.py, so a new bucket shows here by itself).
    slices = [
        Query(f"{n.MFU_5M}{{{JOB}}}", "MFU (useful model work)"),
        Query(f"sum by (component) ({n.WATERFALL_5M}{{{JOB}}})", "{{component}}"),
    ]
    waterfall_meaning = (
        "1 - MFU = exposed comm + bubble + recompute + other + instrumentation + compute × (1 - "
        "kernel efficiency), with kernel efficiency = MFU / compute share: each bar is one "
        "slice of the gap between achieved and peak FLOPs, all as shares of step time, summing "
        "to 1 with MFU. Slices are named by bucket (exposed_comm, bubble_pipeline, bubble_idle, "
        "recompute, other, instrumentation); the compute bucket's shortfall from peak is split "
        "into elementwise (unfused / memory-bound kernels) and kernel_inefficiency (compute "
        "kernels that still do not run at peak: small shapes, low occupancy). "
        "kernel_inefficiency below 0 means the FLOPs per step are overstated or the peak "
        "understated; it is shown as it is, never clipped."
    )
    return Row(
        "Where the step goes",
        [
            timeseries_panel(
                "Step decomposition",
                DECOMPOSITION_MEANING + "Stacked shares of step time; they add up to 100 %.",
                "percentunit",
                [
                    Query(
                        q.bucket_fraction(
                            _RATE,
                            _ONE_JOB,
                            per=("component",),
                            matchers=JOB,
                            part='component!="exposed_comm"',
                        ),
                        "{{component}}",
                    ),
                    Query(
                        q.bucket_fraction(
                            _RATE,
                            _ONE_JOB,
                            per=("axis", "tier"),
                            matchers=JOB,
                            part='component="exposed_comm", axis=~"$axis", tier=~"$tier"',
                        ),
                        "exposed_comm {{axis}}/{{tier}}",
                    ),
                ],
                stacked=True,
                min_value=0,
                max_value=1,
                width=14,
            ),
            bargauge_panel(
                "MFU waterfall: where 1 - MFU goes (5 min)",
                waterfall_meaning,
                "percentunit",
                [Query(s.expr, s.legend, instant=True) for s in slices],
                thresholds=[(None, BLUE)],
                max_value=1,
                width=10,
            ),
            timeseries_panel(
                "MFU waterfall over time",
                waterfall_meaning + " Stacked over time: the slice that grew when MFU dropped is "
                "where to look.",
                "percentunit",
                slices,
                stacked=True,
                max_value=1,
            ),
            timeseries_panel(
                "Compute by kernel class",
                "Share of step time in compute kernels of each class (from the profiled "
                "windows): gemm (matmuls and convolutions), attention (fused attention), "
                "elementwise_norm_reduce (unfused / memory-bound kernels: elementwise, norms, "
                "softmax, reductions, optimizer), other. The elementwise_norm_reduce line is the "
                "waterfall's unfused-kernels slice f_elementwise, a part of 'compute below peak': "
                "fusing those kernels (torch.compile, fused norms/optimizers) wins it back.",
                "percentunit",
                [
                    Query(
                        q.step_fraction(
                            q.COMPUTE_CLASS_SECONDS, _RATE, _ONE_JOB, per=("class",), matchers=JOB
                        ),
                        "{{class}}",
                    ),
                ],
                stacked=True,
                min_value=0,
                max_value=1,
            ),
            timeseries_panel(
                "Exposed communication by axis and tier",
                "Share of step time in which no compute kernel runs while a collective of this "
                "axis/tier does. Red from 20 % for the job as a whole (MFUScopeExposedCommHigh). "
                "Communication hidden under compute is not counted here (see Overlapped).",
                "percentunit",
                [
                    Query(
                        f'{n.EXPOSED_COMM_AXIS_TIER_5M}{{{JOB}, axis=~"$axis", tier=~"$tier"}}',
                        "{{axis}}/{{tier}}",
                    ),
                    Query(
                        f"{n.OVERLAPPED_COMM_5M}{{{JOB}}}",
                        "overlapped (hidden under compute)",
                    ),
                ],
                thresholds=EXPOSED_BANDS,
                min_value=0,
            ),
            breakdown_age_panel(
                "the split of every step into buckets (decomposition, waterfall slices, kernel "
                "classes)",
                width=6,
                height=8,
            ),
            breakdown_spread_panel(width=6, height=8),
        ],
    )


def _step_time_row() -> Row:
    buckets = f"mfuscope_step_duration_seconds_bucket{{{JOB}}}"
    return Row(
        "Step time and stragglers",
        [
            timeseries_panel(
                "Step time p50 / p99 / mean",
                "Per-rank step wall time. p99 well above p50 means some steps (or some ranks) are "
                "slow: periodic checkpointing or evaluation, a straggler, or data-loader stalls. "
                "Quantiles are interpolated within histogram buckets.",
                "s",
                [
                    Query(
                        f"histogram_quantile(0.5, sum by (le) (rate({buckets}[$__rate_interval])))",
                        "p50",
                    ),
                    Query(
                        "histogram_quantile(0.99, "
                        f"sum by (le) (rate({buckets}[$__rate_interval])))",
                        "p99",
                    ),
                    Query(q.mean_step_seconds(_RATE, _ONE_JOB, JOB), "mean"),
                ],
                min_value=0,
            ),
            timeseries_panel(
                "Straggler ratio of the slowest ranks",
                "Recent step time of the slowest ranks divided by the job's median rank. 1.0 = "
                "as fast as the median. In synchronous training every rank waits for the slowest, "
                "so one rank at 1.3 costs the whole job. Red from 1.2 (MFUScopeStragglerRank).",
                "suffix:×",
                [
                    Query(
                        f"mfuscope_straggler_ratio{{{JOB}}}", "rank {{rank}} on {{node}} ({{host}})"
                    )
                ],
                thresholds=STRAGGLER_BANDS,
                min_value=1,
            ),
            table_panel(
                "Slowest ranks now",
                "The ranks the collector reports as slowest, worst first, with their step time "
                "relative to the job median, and the node and host each reports from.",
                "suffix:×",
                [Query(f"sort_desc(mfuscope_straggler_ratio{{{JOB}}})", instant=True, table=True)],
                renames={
                    "rank": "Rank",
                    "node": "Node",
                    "host": "Host",
                    "Value": "Step time / median",
                },
                sort_by="Step time / median",
                thresholds=STRAGGLER_BANDS,
                colored_column="Step time / median",
                width=12,
            ),
        ],
    )


def _restarts_row() -> Row:
    redone = Query(f"sum(job:mfuscope_rerun_steps:rate5m{{{JOB}}})", "redone rank-steps/s")
    return Row(
        "Restarts and redone work",
        [
            timeseries_panel(
                "Restarts and redone steps",
                "A restart is a new launch of the job's agents under the same job name (a "
                "crash, then a relaunch from the last checkpoint). Redone rank-steps per second: "
                "steps whose number an earlier launch had already reported, run again since the "
                "checkpoint: real work on the devices that advances the model no further. "
                "Restarts counted over the last hour; 3 or more fires MFUScopeJobRestarting.",
                "short",
                [
                    Query(
                        f"max(job:mfuscope_job_restarts:increase1h{{{JOB}}})",
                        "restarts in the last hour",
                    ),
                    redone,
                ],
                min_value=0,
                width=9,
            ),
            timeseries_panel(
                "Goodput: useful vs redone steps",
                "Rank-steps per second, stacked: useful ones advanced training, redone ones "
                "repeated work an earlier launch had done before it crashed. The stack is the "
                "step rate the devices sustained; only the useful part is progress.",
                "short",
                [
                    Query(f"sum(job:mfuscope_useful_steps:rate5m{{{JOB}}})", "useful rank-steps/s"),
                    redone,
                ],
                stacked=True,
                min_value=0,
                width=9,
            ),
            stat_panel(
                "Restarts (1 h)",
                "New launches of the job in the last hour. Amber from 1, red from 3 "
                "(MFUScopeJobRestarting).",
                "short",
                Query(f"max(job:mfuscope_job_restarts:increase1h{{{JOB}}})"),
                thresholds=RESTART_BANDS,
                decimals=0,
                width=3,
                height=8,
            ),
            stat_panel(
                "Step goodput (5 min)",
                "Useful rank-steps / all rank-steps over 5 min: 100 % while nothing is redone; "
                "below after a restart, until the job is past the step it had reached.",
                "percentunit",
                Query(f"min(job:mfuscope_useful_steps:ratio_rate5m{{{JOB}}})"),
                width=3,
                height=8,
            ),
        ],
    )


def _health_row() -> Row:
    return Row(
        "Telemetry health",
        [
            timeseries_panel(
                "Agent problems per second",
                "Dropped: step reports the agents discarded (buffer full while the collector "
                "was unreachable); MFU reads low meanwhile (MFUScopeReportsDropped). Send "
                "failures: attempts that failed and were retried. Profiler failures: profiled "
                "windows that failed (the decomposition goes stale). All should be 0.",
                "short",
                [
                    Query(
                        f"sum(rate(mfuscope_reports_dropped_total{{{JOB}}}[$__rate_interval]))",
                        "reports dropped",
                    ),
                    Query(
                        f"sum(rate(mfuscope_agent_send_failures_total{{{JOB}}}[$__rate_interval]))",
                        "send failures",
                    ),
                    Query(
                        f"sum(rate(mfuscope_profiler_failures_total{{{JOB}}}[$__rate_interval]))",
                        "profiler failures",
                    ),
                    Query(
                        f"sum(rate(mfuscope_reports_duplicate_total{{{JOB}}}[$__rate_interval]))",
                        "duplicates (re-sent, ignored)",
                    ),
                ],
                thresholds=[(None, GREEN), (0.001, RED)],
                min_value=0,
            ),
            timeseries_panel(
                "Last report age over time",
                "Age of the most silent rank's latest report. Reports arrive every few seconds "
                "(at least every 10 s, also while a rank waits in a collective). Above 90 s while "
                "other ranks report: their agents cannot reach the collector "
                "(MFUScopeAgentsSilent); above 120 s for every rank: their processes died or are "
                "wedged (MFUScopeJobStalled). No data once every agent closed (a normal end). The "
                "collector forgets ranks silent for 5 min.",
                "s",
                [Query(f"max(mfuscope_last_report_age_seconds{{{JOB}}})", "last report age")],
                thresholds=REPORT_AGE_BANDS,
                min_value=0,
            ),
        ],
    )


def build() -> Any:
    """The Job dashboard builder (one job at a time)."""
    return build_dashboard(
        UID,
        "mfuscope / Job",
        "One training job: MFU and HFU, where the job's time went (effective MFU), where each "
        "step's time goes, the MFU waterfall, step time "
        "and stragglers, hangs and arrival skew, restarts and redone work, the hardware counters "
        "per tier, and the health of its telemetry.",
        [
            _utilisation_row(),
            job_time_row(),
            _decomposition_row(),
            _step_time_row(),
            hangs_row(),
            _restarts_row(),
            *hardware_rows(),
            _health_row(),
        ],
        single_job=True,
    )
