"""Communication: bus bandwidth per tier and op against the tier spec, exposure, bytes, overlap."""

from __future__ import annotations

from typing import Any

from _common import (
    JOB,
    JOB_AXIS_TIER,
    Query,
    Row,
    bargauge_panel,
    build_dashboard,
    table_panel,
    timeseries_panel,
)
from breakdown_age import breakdown_age_panel
from fleet_dashboard import EFFICIENCY_BANDS, EXPOSED_BANDS
from mfuscope.core.promql import names as n
from mfuscope.core.promql import quantities as q

__all__ = ["UID", "build"]

UID = "mfuscope-communication"

_SELECTOR = f"{{{JOB_AXIS_TIER}}}"
# The recording rules' latest figures: the 5 min ratio where collectives are timed on every step,
# else the latest profiled window's, held for up to 1 h (docs/operations.md).
_EFFICIENCY = n.EFFICIENCY_LATEST
_BUSBW = n.BUSBW_LATEST
_MEAN_BYTES = n.MEAN_MESSAGE_BYTES_LATEST
_OVERLAPPED = n.COLLECTIVE_OVERLAP_LATEST

BUSBW_MEANING = (
    "Bus bandwidth as nccl-tests defines it: busbw = (size S / time) × bus factor, factor "
    "2(n-1)/n for all_reduce, (n-1)/n for all_gather, reduce_scatter and all_to_all, 1 for "
    "broadcast, reduce, send/recv; comparable across ops and group sizes and with the link "
    "rate. Time is the collective's duration on the device, including waiting for the slowest "
    "peer, over the calls whose size is known (calls of unknown size add no bytes, so they are "
    "left out of the time too). Over the last 5 min where the backend times every call (NCCL "
    "with timing, the agent's default); elsewhere (gloo) from profiled windows: the latest "
    "window's figure, held until the next one for up to 1 h (Breakdown age says how old it is). "
)


def _rate(metric: str, by: str) -> str:
    return f"sum by ({by}) (rate({metric}{_SELECTOR}[$__rate_interval]))"


def _bandwidth_row() -> Row:
    return Row(
        "Bus bandwidth",
        [
            timeseries_panel(
                "Bus bandwidth by tier and op",
                BUSBW_MEANING + "Dashed: the tier's spec (unidirectional link rate per GPU or "
                "NIC). Far below the spec for large messages: the fabric underperforms.",
                "Bps",
                [
                    Query(f"{_BUSBW}{_SELECTOR}", "{{job}} {{op}} {{axis}}/{{tier}}"),
                    Query(q.tier_spec(matchers=JOB_AXIS_TIER), "spec {{job}} {{axis}}/{{tier}}"),
                ],
                min_value=0,
                dashed_series_regex="^spec .*",
                width=14,
            ),
            bargauge_panel(
                "Bus-bandwidth efficiency now",
                "busbw / tier spec per op, axis and tier, the latest figure (see Bus bandwidth by "
                "tier and op). Red below 50 %, "
                "amber below 80 %. MFUScopeTierBusbwLow fires below 50 % when the mean message is "
                "16 MiB or more; small messages are latency-bound and stay low on a healthy "
                "fabric. No bar where the spec is unknown (see Link spec sources).",
                "percentunit",
                [Query(f"sort({_EFFICIENCY}{_SELECTOR})", "{{op}} {{axis}}/{{tier}}", True)],
                thresholds=EFFICIENCY_BANDS,
                min_value=0,
                max_value=1,
                width=7,
            ),
            breakdown_age_panel(
                "busbw, efficiency, message size and overlap (where collectives are timed only "
                "in windows)",
                width=3,
                height=8,
            ),
            timeseries_panel(
                "Bus-bandwidth efficiency (busbw / tier spec)",
                "busbw divided by the spec of the group's tier, per op, axis and tier (the latest "
                "figure). "
                "Red below 50 %, amber below 80 %. A drop on one tier only points at that "
                "fabric; a drop everywhere at the same time often is a straggler that everyone "
                "waits for.",
                "percentunit",
                [Query(f"{_EFFICIENCY}{_SELECTOR}", "{{job}} {{op}} {{axis}}/{{tier}}")],
                thresholds=EFFICIENCY_BANDS,
                min_value=0,
                width=24,
            ),
            table_panel(
                "Link spec sources",
                "Where each axis and tier's spec comes from: datasheet (device table, reference "
                "system NICs), sysfs (the node's NIC ports; across nodes the NICs the group's "
                "ranks on a node drive: min(ranks, NICs) x port rate), nvml (the GPU's NVLink or "
                "PCIe), user (agent options), or unknown: no spec, so no efficiency is shown and "
                "MFUScopeTierBusbwLow cannot fire (CPU/gloo runs, unknown devices).",
                "none",
                [Query(f"mfuscope_tier_peak_info{_SELECTOR}", instant=True, table=True)],
                renames={"job": "Job", "axis": "Axis", "tier": "Tier", "source": "Source"},
                width=24,
                height=6,
            ),
            table_panel(
                "Collectives by op, axis and tier",
                "Per op, axis and tier: busbw, its efficiency against the tier spec, the mean "
                "message size S (small messages are latency-bound; busbw nears the link rate only "
                "for messages of tens of MiB and more), all three the latest figures (see Bus "
                "bandwidth by tier and op); algorithm bytes per second (S) over the last 5 min.",
                "none",
                [
                    Query(f"{_BUSBW}{_SELECTOR}", instant=True, table=True),
                    Query(f"{_EFFICIENCY}{_SELECTOR}", instant=True, table=True),
                    Query(f"{_MEAN_BYTES}{_SELECTOR}", instant=True, table=True),
                    Query(f"{n.COLLECTIVE_BYTES_5M}{_SELECTOR}", instant=True, table=True),
                ],
                renames={
                    "job": "Job",
                    "op": "Op",
                    "axis": "Axis",
                    "tier": "Tier",
                    "Value #A": "busbw",
                    "Value #B": "Efficiency",
                    "Value #C": "Mean message",
                    "Value #D": "Bytes/s (S)",
                },
                sort_by="busbw",
                thresholds=EFFICIENCY_BANDS,
                colored_column="Efficiency",
                column_units={
                    "busbw": "Bps",
                    "Efficiency": "percentunit",
                    "Mean message": "bytes",
                    "Bytes/s (S)": "Bps",
                },
            ),
        ],
    )


def _exposure_row() -> Row:
    return Row(
        "Exposure and traffic",
        [
            timeseries_panel(
                "Exposed communication by axis and tier",
                "Share of step time in which no compute kernel runs while a collective of this "
                "axis/tier does: the network time the job waits for. Stacked. Red from 20 % "
                "for a job as a whole (MFUScopeExposedCommHigh).",
                "percentunit",
                [
                    Query(
                        q.bucket_fraction(
                            q.DASHBOARD_RATE,
                            per=("axis", "tier"),
                            matchers=JOB,
                            part='component="exposed_comm", axis=~"$axis", tier=~"$tier"',
                        ),
                        "{{job}} {{axis}}/{{tier}}",
                    )
                ],
                thresholds=EXPOSED_BANDS,
                stacked=True,
                min_value=0,
            ),
            timeseries_panel(
                "Overlapped share of collective time",
                "Share of each axis/tier's collective time hidden under compute kernels (1 = "
                "fully hidden, free). Data-parallel gradient reduction should overlap with the "
                "backward pass; tensor-parallel collectives usually cannot. From profiled windows: "
                "the latest window's figure, held until the next (Breakdown age).",
                "percentunit",
                [Query(f"{_OVERLAPPED}{_SELECTOR}", "{{job}} {{axis}}/{{tier}}")],
                min_value=0,
                max_value=1,
            ),
            timeseries_panel(
                "Collective bytes per second (size S)",
                "Algorithm bytes moved by collectives per second (the nccl-tests size S, not "
                "multiplied by the bus factor), per op, axis and tier, summed over ranks: every "
                "call, from the agents' always-on flight-recorder records.",
                "Bps",
                [
                    Query(
                        _rate("mfuscope_collective_bytes_total", "job, op, axis, tier"),
                        "{{job}} {{op}} {{axis}}/{{tier}}",
                    )
                ],
                min_value=0,
            ),
            timeseries_panel(
                "Mean message size",
                "Mean size S per collective call. Small messages are latency-bound (their busbw "
                "stays far below the link rate on any fabric); large ones should approach it. "
                "Calls of unknown size count as calls without bytes, so this reads low when "
                "there are any. The latest figure, like busbw.",
                "bytes",
                [Query(f"{_MEAN_BYTES}{_SELECTOR}", "{{job}} {{op}} {{axis}}/{{tier}}")],
                min_value=0,
            ),
        ],
    )


def build() -> Any:
    """The Communication dashboard builder."""
    return build_dashboard(
        UID,
        "mfuscope / Communication",
        "Collectives per tier, axis and op: bus bandwidth against the tier spec, exposed "
        "communication, bytes moved, message sizes and overlap with compute.",
        [_bandwidth_row(), _exposure_row()],
    )
