"""Job dashboard row "Hangs and arrival skew": ranks blocked in collectives, the ranks they wait
for, and who arrives late at collectives (docs/definitions.md#hangs and #arrival-skew).

The blocked and suspect series exist only while some rank waits 10 s or more in a collective, so
the stat panels fall back to 0 (`or vector(0)`) and the suspects table is empty when all is well.

Where each signal is computed (docs/fleet.md): blocked ranks and waits by each collector (summed
over the job's collectors here); the ranks the job waits for, arrival skew and lateness by the
recording rules, which join every collector's series, so they hold with one sidecar per node.
"""

from __future__ import annotations

from _common import (
    AMBER,
    GREEN,
    JOB,
    RED,
    Query,
    Row,
    Threshold,
    stat_panel,
    table_panel,
    timeseries_panel,
)

__all__ = ["WAIT_BANDS", "hangs_row"]

# Must match the collector's blocked threshold (10 s) and MFUScopeCollectiveHang (60 s).
WAIT_BANDS: list[Threshold] = [(None, GREEN), (10, AMBER), (60, RED)]
_BLOCKED = f"mfuscope_collective_blocked_ranks{{{JOB}}}"
_WAITED = f"mfuscope_collective_blocked_seconds{{{JOB}}}"
_SUSPECTS = f"job_rank:mfuscope_collective_hang_suspect:seconds{{{JOB}}}"


def hangs_row() -> Row:
    return Row(
        "Hangs and arrival skew",
        [
            stat_panel(
                "Ranks blocked in a collective",
                "Live ranks that have waited 10 s or more in a collective (each agent reports, "
                "from its own thread, the oldest collective its rank entered and has not "
                "completed), counted by each collector and summed over the job's collectors. 0 "
                "while the job runs normally.",
                "none",
                Query(f"sum({_BLOCKED}) or vector(0)"),
                thresholds=[(None, GREEN), (1, RED)],
                width=4,
            ),
            stat_panel(
                "Longest wait in a collective",
                "How long the longest-waiting rank has been in its collective. Red from 60 s: "
                "MFUScopeCollectiveHang pages.",
                "s",
                Query(f"max({_WAITED}) or vector(0)"),
                thresholds=WAIT_BANDS,
                width=4,
            ),
            table_panel(
                "Ranks the job waits for",
                "While ranks are blocked: the ranks they wait for. not_joined: the rank never "
                "entered collective number seq of that group (its process died, stalled, or "
                "took another path); desync: it entered another op there, or the ranks wait "
                "for each other in a cycle. Waited: how long the longest-waiting rank has "
                "waited for it. Computed by the recording rules (mfuscope.hangs), which join "
                "every collector's waits with the progress of the ranks whose step is overdue, "
                "so a rank is named whichever sidecar it reports to.",
                "s",
                [Query(f"sort_desc({_SUSPECTS})", instant=True, table=True)],
                renames={
                    "rank": "Rank",
                    "node": "Node",
                    "host": "Host",
                    "op": "Op",
                    "seq": "Seq",
                    "axis": "Axis",
                    "tier": "Tier",
                    "reason": "Reason",
                    "Value": "Waited",
                },
                sort_by="Waited",
                thresholds=WAIT_BANDS,
                colored_column="Waited",
                width=16,
            ),
            timeseries_panel(
                "Blocked ranks by axis, tier and op",
                "Ranks waiting 10 s or more, under the collective they have waited in longest.",
                "none",
                [Query(f"sum by (axis, tier, op) ({_BLOCKED})", "{{op}} on {{axis}}/{{tier}}")],
                min_value=0,
                width=8,
            ),
            timeseries_panel(
                "Arrival skew by axis and tier",
                "Spread of the ranks' enqueue times of one collective (latest minus earliest), "
                "smoothed over recent steps: time the early ranks wait for the late ones, every "
                "step, not only in profiled windows. Groups whole on one collector: smoothed by "
                "the collector, every step; groups across sidecars: joined by the recording "
                "rules (mfuscope.arrivals) from one collective per group per minute. Exact within "
                "a node; across nodes it includes the hosts' clock offset (NTP: typically below a "
                "few ms).",
                "s",
                [
                    Query(
                        "max by (axis, tier) "
                        f"(job_axis_tier:mfuscope_collective_arrival_skew:seconds{{{JOB}}})",
                        "{{axis}}/{{tier}}",
                    )
                ],
                min_value=0,
                width=8,
            ),
            timeseries_panel(
                "Latest-arriving ranks",
                "How long after their groups' median these ranks enter collectives (by the "
                "collector, smoothed, for groups whole on one collector; by the recording rules "
                "across sidecars, one collective per group per minute). A rank that is always "
                "late is a host-side straggler (data loading, CPU, Python); compare with the "
                "straggler ratio, which needs profiled windows.",
                "s",
                [
                    Query(
                        "topk(5, job_rank:mfuscope_collective_arrival_lateness:seconds"
                        f"{{{JOB}}} > 0)",
                        "rank {{rank}} on {{node}} ({{host}})",
                    )
                ],
                min_value=0,
                width=8,
            ),
        ],
    )
