"""Communication: bus bandwidth per tier and op against the tier spec, exposure, bytes, overlap."""

from __future__ import annotations

from typing import Any

from _common import (
    JOB_AXIS_TIER,
    Query,
    Row,
    bargauge_panel,
    build_dashboard,
    table_panel,
    timeseries_panel,
)
from fleet_dashboard import EFFICIENCY_BANDS, EXPOSED_BANDS

__all__ = ["UID", "build"]

UID = "mfuscope-communication"

_SELECTOR = f"{{{JOB_AXIS_TIER}}}"
_EFFICIENCY = "job_op_axis_tier:mfuscope_collective_busbw_efficiency:ratio_rate5m"

BUSBW_MEANING = (
    "Bus bandwidth as nccl-tests defines it: busbw = (size S / time) × bus factor, factor "
    "2(n-1)/n for all_reduce, (n-1)/n for all_gather, reduce_scatter and all_to_all, 1 for "
    "broadcast, reduce, send/recv; comparable across ops and group sizes and with the link "
    "rate. Time is the collective's duration on the device, including waiting for the slowest "
    "peer, over the calls whose size is known (calls of unknown size add no bytes, so they are "
    "left out of the time too). Live from every call where the backend times collectives "
    "(NCCL with timing, the agent's default); elsewhere (gloo) from profiled windows. "
)


def _rate(metric: str, by: str) -> str:
    return f"sum by ({by}) (rate({metric}{_SELECTOR}[$__rate_interval]))"


def _bandwidth_row() -> Row:
    by = "job, tier, op"
    return Row(
        "Bus bandwidth",
        [
            timeseries_panel(
                "Bus bandwidth by tier and op",
                BUSBW_MEANING + "Dashed: the tier's spec (unidirectional link rate per GPU or "
                "NIC). Far below the spec for large messages: the fabric underperforms.",
                "Bps",
                [
                    Query(
                        f"{_rate('mfuscope_collective_sized_bus_bytes_total', by)}"
                        f" / ({_rate('mfuscope_collective_sized_seconds_total', by)} > 0)",
                        "{{job}} {{op}} {{tier}}",
                    ),
                    Query(
                        "max by (job, tier) "
                        f"(mfuscope_tier_peak_bandwidth_bytes_per_second{_SELECTOR})",
                        "spec {{job}} {{tier}}",
                    ),
                ],
                min_value=0,
                dashed_series_regex="^spec .*",
                width=14,
            ),
            bargauge_panel(
                "Bus-bandwidth efficiency now",
                "busbw / tier spec per op, axis and tier over the last 5 min. Red below 50 %, "
                "amber below 80 %. MFUScopeTierBusbwLow fires below 50 % when the mean message is "
                "16 MiB or more; small messages are latency-bound and stay low on a healthy "
                "fabric. No bar where the spec is unknown (see Link spec sources).",
                "percentunit",
                [Query(f"sort({_EFFICIENCY}{_SELECTOR})", "{{op}} {{axis}}/{{tier}}", True)],
                thresholds=EFFICIENCY_BANDS,
                min_value=0,
                max_value=1,
                width=10,
            ),
            timeseries_panel(
                "Bus-bandwidth efficiency (busbw / tier spec)",
                "busbw divided by the spec of the group's tier, per op, axis and tier (5 min). "
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
                "Collectives by op, axis and tier (5 min)",
                "Per op, axis and tier: busbw, its efficiency against the tier spec, the mean "
                "message size S (small messages are latency-bound; busbw nears the link rate only "
                "for messages of tens of MiB and more), algorithm bytes per second (S).",
                "none",
                [
                    Query(
                        "job_op_axis_tier:mfuscope_collective_busbw_bytes_per_second:ratio_rate5m"
                        f"{_SELECTOR}",
                        instant=True,
                        table=True,
                    ),
                    Query(f"{_EFFICIENCY}{_SELECTOR}", instant=True, table=True),
                    Query(
                        f"job_op_axis_tier:mfuscope_collective_mean_bytes:ratio_rate5m{_SELECTOR}",
                        instant=True,
                        table=True,
                    ),
                    Query(
                        f"job_op_axis_tier:mfuscope_collective_bytes:rate5m{_SELECTOR}",
                        instant=True,
                        table=True,
                    ),
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
    components = "mfuscope_step_component_seconds_total"
    by_axis_tier = "job, axis, tier"
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
                        f"sum by (job, axis, tier) (rate({components}{{{JOB_AXIS_TIER}, "
                        'component="exposed_comm"}[$__rate_interval])) / on (job) group_left () '
                        f'sum by (job) (rate({components}{{job=~"$job"}}[$__rate_interval]))',
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
                "backward pass; tensor-parallel collectives usually cannot.",
                "percentunit",
                [
                    Query(
                        f"{_rate('mfuscope_collective_overlapped_seconds_total', by_axis_tier)}"
                        f" / ({_rate('mfuscope_collective_profiled_seconds_total', by_axis_tier)}"
                        " > 0)",
                        "{{job}} {{axis}}/{{tier}}",
                    )
                ],
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
                "there are any.",
                "bytes",
                [
                    Query(
                        f"{_rate('mfuscope_collective_bytes_total', 'job, op, axis, tier')}"
                        f" / ({_rate('mfuscope_collective_calls_total', 'job, op, axis, tier')}"
                        " > 0)",
                        "{{job}} {{op}} {{axis}}/{{tier}}",
                    )
                ],
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
