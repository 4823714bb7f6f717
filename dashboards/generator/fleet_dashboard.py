"""Fleet: MFU and HFU of every job, jobs ranked by MFU regression, firing alerts."""

from __future__ import annotations

from typing import Any

from _common import (
    AMBER,
    GREEN,
    JOB,
    JOB_AXIS_TIER,
    RED,
    Query,
    Row,
    bargauge_panel,
    build_dashboard,
    stat_panel,
    table_panel,
    timeseries_panel,
)
from mfuscope.core.promql import names as n
from mfuscope.core.promql import quantities as q
from mfuscope.core.promql.syntax import total

__all__ = ["UID", "build"]

UID = "mfuscope-fleet"

# MFU colour bands. Well-tuned dense LLM training reports roughly 35-55 % MFU on current GPUs
# (PaLM: 46 %, Chowdhery et al. 2022, table 3); below 25 % something is usually wrong.
MFU_BANDS = [(None, RED), (0.25, AMBER), (0.40, GREEN)]
# Must match MFUScopeMFURegression (deploy/prometheus/rules/mfuscope-alerts.yml).
REGRESSION_BANDS = [(None, GREEN), (0.10, AMBER), (0.25, RED)]
# Red below the MFUScopeTierBusbwLow threshold (50 %); green from 80 %, what a healthy fabric
# reaches on large messages (docs/definitions.md#bandwidth-efficiency).
EFFICIENCY_BANDS = [(None, RED), (0.50, AMBER), (0.80, GREEN)]
EXPOSED_BANDS = [(None, GREEN), (0.10, AMBER), (0.20, RED)]

MFU_MEANING = (
    "MFU (model FLOPs utilisation) = model FLOPs per second / the dense peak FLOP/s of the job's "
    "devices: the share of the arithmetic you pay for that advances the model. "
)


def _now_row() -> Row:
    return Row(
        "Fleet now",
        [
            stat_panel(
                "Jobs reporting",
                "Training jobs with at least one rank reporting to a collector right now. A job "
                "disappears 5 min after its last rank stops reporting (collector expiry).",
                "none",
                Query(f"count(count by (job) (mfuscope_ranks{{{JOB}}}))"),
                decimals=0,
            ),
            stat_panel(
                "Ranks reporting",
                "Ranks (processes, usually one per GPU) of the selected jobs that report to a "
                "collector.",
                "none",
                Query(f"sum(mfuscope_ranks{{{JOB}}})"),
                decimals=0,
            ),
            stat_panel(
                "Fleet MFU (5 min)",
                MFU_MEANING + "Here for all selected jobs together: their total model FLOPs over "
                "their total peak FLOP-seconds (jobs whose device peak is unknown are left out of "
                "both).",
                "percentunit",
                Query(
                    q.utilization(
                        total(
                            f"{n.MODEL_FLOPS_5M}{{{JOB}}}"
                            f" and on (job) {n.PEAK_FLOP_SECONDS_5M}{{{JOB}}} > 0",
                            (),
                        ),
                        total(f"{n.PEAK_FLOP_SECONDS_5M}{{{JOB}}}", ()),
                    )
                ),
                thresholds=MFU_BANDS,
            ),
            stat_panel(
                "Model FLOP/s (5 min)",
                "Model FLOPs per second of the selected jobs, summed (the MFU numerator). "
                "Recomputation under activation checkpointing is not included.",
                "flops",
                Query(f"sum({n.MODEL_FLOPS_5M}{{{JOB}}})"),
            ),
            stat_panel(
                "Peak FLOP/s in use",
                "Sum of the dense peak FLOP/s (training dtype, no sparsity) of every reporting "
                "rank's device: what the selected jobs could do at 100 % MFU.",
                "flops",
                Query(f"sum({n.PEAK_FLOPS_SUM}{{{JOB}}})"),
            ),
            stat_panel(
                "Alerts firing",
                "mfuscope alerts firing now, all jobs (Prometheus ALERTS series; the table below "
                "lists them). Each alert's runbook is in docs/operations.md.",
                "none",
                Query('count(ALERTS{alertname=~"MFUScope.*", alertstate="firing"}) or vector(0)'),
                thresholds=[(None, GREEN), (1, RED)],
                decimals=0,
            ),
        ],
    )


def _jobs_row() -> Row:
    return Row(
        "Jobs",
        [
            table_panel(
                "Jobs by MFU regression against their own baseline",
                "One line per job, worst first. Regression = 1 - (MFU over the last 15 min) / "
                "(MFU over the 6 h ending 30 min ago), both over running time only: the share of "
                "its own recent efficiency a job has lost. Empty until a job has run 1 h 30 min. "
                "Amber from 10 %, "
                "red from 25 % (the MFUScopeMFURegression alert levels). HFU also counts "
                "recomputation, so HFU >= MFU.",
                "percentunit",
                [
                    Query(f"{n.MFU_REGRESSION}{{{JOB}}}", instant=True, table=True),
                    Query(f"{n.MFU_INCREASE_15M}{{{JOB}}}", instant=True, table=True),
                    Query(f"{n.MFU_BASELINE_6H}{{{JOB}}}", instant=True, table=True),
                    Query(f"{n.HFU_5M}{{{JOB}}}", instant=True, table=True),
                    Query(f"sum by (job) (mfuscope_ranks{{{JOB}}})", instant=True, table=True),
                ],
                renames={
                    "job": "Job",
                    "Value #A": "MFU regression",
                    "Value #B": "MFU (15 min)",
                    "Value #C": "Baseline MFU (6 h)",
                    "Value #D": "HFU (5 min)",
                    "Value #E": "Ranks",
                },
                sort_by="MFU regression",
                thresholds=REGRESSION_BANDS,
                colored_column="MFU regression",
                column_units={"Ranks": "none"},
                width=14,
            ),
            bargauge_panel(
                "MFU per job now",
                MFU_MEANING + "Last 5 min, best first. Red below 25 %, amber below 40 %.",
                "percentunit",
                [Query(f"sort_desc({n.MFU_5M}{{{JOB}}})", "{{job}}", True)],
                thresholds=MFU_BANDS,
                min_value=0,
                max_value=1,
                width=10,
            ),
            timeseries_panel(
                "MFU per job",
                MFU_MEANING + "5 min rate per job. A step down that persists is a regression; "
                "compare with the job's decomposition on the Job dashboard.",
                "percentunit",
                [Query(f"{n.MFU_5M}{{{JOB}}}", "{{job}}")],
                thresholds=MFU_BANDS,
                min_value=0,
            ),
            timeseries_panel(
                "HFU per job",
                "HFU (hardware FLOPs utilisation) = (model + recomputation FLOPs) per second / "
                "peak FLOP/s. The gap HFU - MFU is the arithmetic spent recomputing activations "
                "(activation checkpointing).",
                "percentunit",
                [Query(f"{n.HFU_5M}{{{JOB}}}", "{{job}}")],
                min_value=0,
            ),
            timeseries_panel(
                "MFU regression per job",
                "1 - (15 min MFU) / (6 h median MFU ending 30 min ago). Positive = worse than the "
                "job's own recent normal. Dashed lines: the warning (10 %) and critical (25 %) "
                "levels of MFUScopeMFURegression, which also needs 10 min above them.",
                "percentunit",
                [Query(f"{n.MFU_REGRESSION}{{{JOB}}}", "{{job}}")],
                thresholds=REGRESSION_BANDS,
            ),
            bargauge_panel(
                "Exposed communication per job now",
                "Share of step time in which no compute kernel runs while a collective does "
                "(waiting on the network), for the selected axes and tiers, last 5 min of "
                "profiled windows. Red from 20 % (MFUScopeExposedCommHigh).",
                "percentunit",
                [
                    Query(
                        "sort_desc(sum by (job) (job_axis_tier:mfuscope_exposed_comm_fraction:"
                        f"ratio_rate5m{{{JOB_AXIS_TIER}}}))",
                        "{{job}}",
                        True,
                    )
                ],
                thresholds=EXPOSED_BANDS,
                min_value=0,
                max_value=1,
            ),
        ],
    )


def _alerts_row() -> Row:
    return Row(
        "Alerts and bus bandwidth",
        [
            table_panel(
                "Firing mfuscope alerts",
                "Every mfuscope alert firing now with its labels. severity: critical pages, "
                "warning goes to the team channel, info is informational. The alert's "
                "annotations (summary, description, runbook) are in Alertmanager; the full "
                "runbook is docs/operations.md, section named after the alert.",
                "none",
                [
                    Query(
                        'ALERTS{alertname=~"MFUScope.*", alertstate="firing"}',
                        instant=True,
                        table=True,
                    )
                ],
                renames={
                    "alertname": "Alert",
                    "severity": "Severity",
                    "job": "Job",
                    "rank": "Rank",
                    "op": "Op",
                    "axis": "Axis",
                    "tier": "Tier",
                    "instance": "Collector",
                    "reason": "Reason",
                },
                width=14,
            ),
            bargauge_panel(
                "Worst bus-bandwidth efficiency per job and tier",
                "For each job and tier, the lowest busbw / tier spec over its collective ops and "
                "axes (nccl-tests busbw; spec = unidirectional link rate): over the last 5 min, "
                "or where collectives are timed only in profiled windows the latest window's, "
                "held for up to 1 h. Small messages are latency-bound and naturally low: check "
                "the mean message size on the Communication dashboard before blaming the fabric.",
                "percentunit",
                [
                    Query(
                        f"sort(min by (job, tier) ({n.EFFICIENCY_LATEST}{{{JOB_AXIS_TIER}}}))",
                        "{{job}} {{tier}}",
                        True,
                    )
                ],
                thresholds=EFFICIENCY_BANDS,
                min_value=0,
                max_value=1,
                width=10,
            ),
        ],
    )


def build() -> Any:
    """The Fleet dashboard builder."""
    return build_dashboard(
        UID,
        "mfuscope / Fleet",
        "MFU and HFU of every training job, jobs ranked by MFU regression against their own "
        "recent baseline, and firing mfuscope alerts.",
        [_now_row(), _jobs_row(), _alerts_row()],
    )
