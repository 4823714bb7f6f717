"""Job dashboard row "Where the job's time went": every rank-second of the job by job-time
category as a stacked share over time, and effective MFU beside the steps' MFU
(docs/definitions.md#job-time-ledger, #effective-mfu).

Shares and both MFUs are ratios of counter increases over Grafana's rate interval, so the row
reads right from the job's first minutes; the budgets stat reads the recorded hour that
MFUScopeJobTimeLost compares (present once the job's counters are an hour old).
"""

from __future__ import annotations

from _common import AMBER, GREEN, JOB, RED, Query, Row, stat_panel, timeseries_panel
from fleet_dashboard import MFU_BANDS
from mfuscope.core.promql import names as n
from mfuscope.core.promql import quantities as q

__all__ = ["job_time_row"]

_RATE = q.DASHBOARD_RATE
_ONE_JOB: tuple[str, ...] = ()
# Must match MFUScopeJobTimeLost's checkpoint and restart budgets (10 %).
BUDGET_BANDS = [(None, GREEN), (0.05, AMBER), (0.10, RED)]

_MEANING = (
    "Every rank-second of the job, from each rank's process start to its exit, in one "
    "category: startup (process start to the first step), step (steps that advanced "
    "training), redone_step (steps run again after a restart), checkpoint_save, "
    "checkpoint_load, evaluation, other_phase (phases the job or its framework integration "
    "marks; they leave the step before them), hung (blocked in a collective past the hang "
    "rule), down (from a dead process's last report to its replacement's start), shutdown "
    "(after the last step). "
)


def job_time_row() -> Row:
    return Row(
        "Where the job's time went",
        [
            timeseries_panel(
                "Job time by category",
                _MEANING + "Stacked shares of the job's rank-seconds; they add up to 100 %. "
                "Everything but step is time the devices are paid for without advancing the model.",
                "percentunit",
                [Query(q.job_time_share(_RATE, _ONE_JOB, JOB), "{{category}}")],
                stacked=True,
                min_value=0,
                max_value=1,
                width=14,
            ),
            timeseries_panel(
                "Effective MFU beside step MFU",
                "Step MFU: model FLOPs over the peak x the steps' time. Effective MFU: the model "
                "FLOPs of the steps that advanced training over the peak x every rank-second of "
                "the job, startup, checkpoints, hangs and time down included: what the job "
                "delivered. The gap between them is the job's time outside useful steps "
                "(left). Dashed: effective MFU over the job's life as the collectors saw it.",
                "percentunit",
                [
                    Query(q.mfu(_RATE, _ONE_JOB, JOB), "step MFU"),
                    Query(q.effective_mfu(_RATE, _ONE_JOB, JOB), "effective MFU"),
                    Query(f"max({n.EFFECTIVE_MFU}{{{JOB}}})", "effective MFU over the job's life"),
                ],
                thresholds=MFU_BANDS,
                min_value=0,
                dashed_series_regex=".*job's life$",
                width=10,
            ),
            stat_panel(
                "Lost to checkpoints (1 h)",
                "checkpoint_save + checkpoint_load over the job's rank-seconds in the last hour "
                "(MFUScopeJobTimeLost above 10 %). Empty until the job's counters are an hour "
                "old.",
                "percentunit",
                Query(f'max({n.JOB_TIME_BUDGET_1H}{{{JOB}, budget="checkpoint"}})'),
                thresholds=BUDGET_BANDS,
                width=4,
            ),
            stat_panel(
                "Lost to startup and down (1 h)",
                "startup + down over the job's rank-seconds in the last hour: slow starts and "
                "restarts (MFUScopeJobTimeLost above 10 %). Empty until the job's counters are "
                "an hour old.",
                "percentunit",
                Query(f'max({n.JOB_TIME_BUDGET_1H}{{{JOB}, budget="restart"}})'),
                thresholds=BUDGET_BANDS,
                width=4,
            ),
            stat_panel(
                "Hung (1 h)",
                "Rank-seconds blocked in collectives over the job's rank-seconds in the last "
                "hour: any fires MFUScopeJobTimeLost once the job's counters are an hour old "
                "(the hangs row names the ranks waited for).",
                "percentunit",
                Query(f'max({n.JOB_TIME_SHARE_1H}{{{JOB}, category="hung"}})'),
                thresholds=[(None, GREEN), (1e-9, RED)],
                width=4,
            ),
            stat_panel(
                "Effective MFU (1 h)",
                "Useful model FLOPs over the peak x every rank-second of the last hour.",
                "percentunit",
                Query(f"max({n.EFFECTIVE_MFU_1H}{{{JOB}}})"),
                thresholds=MFU_BANDS,
                width=4,
            ),
        ],
    )
