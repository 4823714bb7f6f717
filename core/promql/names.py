"""The names of the recorded series the dashboards read, as the recording rules define them
(`mfuscope.core.promql.recording`). Public: alerts, dashboards and users' own dashboards read them,
so a name here never changes (docs/operations.md lists them all)."""

from __future__ import annotations

__all__ = [
    "ARRIVAL_LATENESS_SECONDS",
    "ARRIVAL_SKEW_SECONDS",
    "BUBBLE_FRACTION_5M",
    "BUSBW_5M",
    "BUSBW_LATEST",
    "BUSBW_TIER_OP_5M",
    "COLLECTIVE_BYTES_5M",
    "COLLECTIVE_OVERLAP_5M",
    "COLLECTIVE_OVERLAP_LATEST",
    "EFFICIENCY_5M",
    "EFFICIENCY_LATEST",
    "ELEMENTWISE_5M",
    "EXPOSED_COMM_5M",
    "EXPOSED_COMM_AXIS_TIER_5M",
    "HANG_SUSPECT_SECONDS",
    "HFU_5M",
    "KERNEL_EFFICIENCY_5M",
    "KERNEL_INEFFICIENCY_5M",
    "MEAN_MESSAGE_BYTES_5M",
    "MEAN_MESSAGE_BYTES_LATEST",
    "MFU_5M",
    "MFU_BASELINE_6H",
    "MFU_INCREASE_15M",
    "MFU_REGRESSION",
    "MODEL_FLOPS_5M",
    "OVERLAPPED_COMM_5M",
    "PEAK_FLOPS_SUM",
    "PEAK_FLOP_SECONDS_5M",
    "STEP_FRACTION_5M",
    "WATERFALL_5M",
    "WATERFALL_BASELINE_6H",
    "WATERFALL_GROWTH",
    "WATERFALL_INCREASE_15M",
]

MODEL_FLOPS_5M = "job:mfuscope_model_flops:rate5m"
ARRIVAL_SKEW_SECONDS = "job_axis_tier:mfuscope_collective_arrival_skew:seconds"
ARRIVAL_LATENESS_SECONDS = "job_rank:mfuscope_collective_arrival_lateness:seconds"
HANG_SUSPECT_SECONDS = "job_rank:mfuscope_collective_hang_suspect:seconds"
PEAK_FLOP_SECONDS_5M = "job:mfuscope_peak_flop_seconds:rate5m"
PEAK_FLOPS_SUM = "job:mfuscope_peak_flops:sum"
MFU_5M = "job:mfuscope_mfu:ratio_rate5m"
HFU_5M = "job:mfuscope_hfu:ratio_rate5m"

STEP_FRACTION_5M = "job_component:mfuscope_step_fraction:ratio_rate5m"
EXPOSED_COMM_AXIS_TIER_5M = "job_axis_tier:mfuscope_exposed_comm_fraction:ratio_rate5m"
EXPOSED_COMM_5M = "job:mfuscope_exposed_comm_fraction:ratio_rate5m"
BUBBLE_FRACTION_5M = "job:mfuscope_bubble_fraction:ratio_rate5m"
OVERLAPPED_COMM_5M = "job:mfuscope_overlapped_comm_fraction:ratio_rate5m"
KERNEL_EFFICIENCY_5M = "job:mfuscope_kernel_efficiency:ratio_rate5m"
ELEMENTWISE_5M = "job:mfuscope_elementwise_fraction:ratio_rate5m"
KERNEL_INEFFICIENCY_5M = "job:mfuscope_kernel_inefficiency_fraction:ratio_rate5m"
# Every slice of 1 - MFU as one series per slice (label `component`), over 5 min, the last
# 15 min and the 6 h baseline of the regression alert.
WATERFALL_5M = "job_component:mfuscope_waterfall_slice:ratio_rate5m"
WATERFALL_INCREASE_15M = "job_component:mfuscope_waterfall_slice:ratio_increase15m"
WATERFALL_BASELINE_6H = "job_component:mfuscope_waterfall_slice:ratio_baseline6h"
WATERFALL_GROWTH = "job_component:mfuscope_waterfall_slice_growth:ratio"

MFU_INCREASE_15M = "job:mfuscope_mfu:ratio_increase15m"
MFU_BASELINE_6H = "job:mfuscope_mfu:ratio_baseline6h"
MFU_REGRESSION = "job:mfuscope_mfu_regression:ratio"

COLLECTIVE_BYTES_5M = "job_op_axis_tier:mfuscope_collective_bytes:rate5m"
BUSBW_5M = "job_op_axis_tier:mfuscope_collective_busbw_bytes_per_second:ratio_rate5m"
BUSBW_TIER_OP_5M = "job_tier_op:mfuscope_collective_busbw_bytes_per_second:ratio_rate5m"
EFFICIENCY_5M = "job_op_axis_tier:mfuscope_collective_busbw_efficiency:ratio_rate5m"
MEAN_MESSAGE_BYTES_5M = "job_op_axis_tier:mfuscope_collective_mean_bytes:ratio_rate5m"
COLLECTIVE_OVERLAP_5M = "job_axis_tier:mfuscope_collective_overlapped:ratio_rate5m"
# The latest 5 min figure that had collectives, held for up to 1 h (profiled windows).
BUSBW_LATEST = "job_op_axis_tier:mfuscope_collective_busbw_bytes_per_second:last1h_ratio_rate5m"
EFFICIENCY_LATEST = "job_op_axis_tier:mfuscope_collective_busbw_efficiency:last1h_ratio_rate5m"
MEAN_MESSAGE_BYTES_LATEST = "job_op_axis_tier:mfuscope_collective_mean_bytes:last1h_ratio_rate5m"
COLLECTIVE_OVERLAP_LATEST = "job_axis_tier:mfuscope_collective_overlapped:last1h_ratio_rate5m"
