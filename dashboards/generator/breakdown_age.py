"""The breakdown-age panel of the Job and Communication dashboards: how old the newest profiled
window is, so a reader knows how old the figures that come only from windows are; and the Job
dashboard's breakdown-spread panel: how far those figures can be off between windows."""

from __future__ import annotations

from _common import AMBER, GREEN, JOB, RED, Panel, Query, stat_panel

__all__ = [
    "BREAKDOWN_AGE_BANDS",
    "BREAKDOWN_SPREAD_BANDS",
    "breakdown_age_panel",
    "breakdown_spread_panel",
]

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


# Amber when exposed comm moved by 5 points between windows, red by 15: a carried figure is then
# a rough guide only (docs/definitions.md#carried-breakdowns).
BREAKDOWN_SPREAD_BANDS = [(None, GREEN), (0.05, AMBER), (0.15, RED)]


def breakdown_spread_panel(*, width: int, height: int) -> Panel:
    """How far a carried breakdown can be off: the spread between the latest windows."""
    return stat_panel(
        "Breakdown spread",
        "How far a carried breakdown can be off. Steps between profiled windows carry the latest "
        "window's split; this is the largest difference in exposed communication's share of the "
        "step between a rank's latest 5 windows (the rank where it is largest). 2 % says the "
        "windows agree and the carried split is a fair estimate; 20 % says the share moves from "
        "window to window (ranks waiting on each other by varying amounts) and any one window's "
        "split, carried, can be off by that much. Empty until a rank has two windows.",
        "percentunit",
        Query(f"max by (job) (mfuscope_breakdown_spread_ratio{{{JOB}}})", "{{job}}"),
        thresholds=BREAKDOWN_SPREAD_BANDS,
        width=width,
        height=height,
    )
