"""The breakdown-age panel of the Job and Communication dashboards: how old the newest profiled
window is, so a reader knows how old the figures that come only from windows are."""

from __future__ import annotations

from _common import AMBER, GREEN, JOB, RED, Panel, Query, stat_panel

__all__ = ["BREAKDOWN_AGE_BANDS", "breakdown_age_panel"]

# Amber past a 30 min cadence; red at 1 h, when the recording rules stop holding the latest
# window's collective figures (deploy/prometheus/rules, the `last1h_` series).
BREAKDOWN_AGE_BANDS = [(None, GREEN), (1800, AMBER), (3600, RED)]


def breakdown_age_panel(what: str, *, width: int, height: int) -> Panel:
    """The age of the job's newest profiled window; `what` names the figures it dates."""
    return stat_panel(
        "Breakdown age",
        f"Seconds since the collector received the newest profiled window of the job: {what} "
        "come from that window until the next one. Windows come every 5 min by "
        "default, later when the agents' overhead budget stretches them. Amber from 1800 s, "
        "red from 3600 s (after 1 h without a window the held collective figures disappear). "
        "Empty: no window yet, or profiling off.",
        "s",
        Query(f"min by (job) (mfuscope_breakdown_age_seconds{{{JOB}}})", "{{job}}"),
        thresholds=BREAKDOWN_AGE_BANDS,
        width=width,
        height=height,
    )
