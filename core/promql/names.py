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
    "EFFECTIVE_MFU",
    "EFFECTIVE_MFU_1H",
    "EFFICIENCY_5M",
    "EFFICIENCY_LATEST",
    "ELEMENTWISE_5M",
    "EXPOSED_COMM_5M",
    "EXPOSED_COMM_AXIS_TIER_5M",
    "HANG_SUSPECT_SECONDS",
    "HFU_5M",
    "JOB_TIME_BUDGET_1H",
    "JOB_TIME_SHARE_1H",
    "KERNEL_EFFICIENCY_5M",
    "KERNEL_INEFFICIENCY_5M",
    "MEAN_MESSAGE_BYTES_5M",
    "MEAN_MESSAGE_BYTES_LATEST",
    "MFU_5M",
    "MFU_BASELINE_6H",
    "MFU_BELOW_RUN_BASELINE",
    "MFU_INCREASE_15M",
    "MFU_REGRESSION",
    "MFU_RUN_BASELINE",
    "MODEL_FLOPS_5M",
    "OVERLAPPED_COMM_5M",
    "PEAK_FLOPS_SUM",
    "PEAK_FLOP_SECONDS_5M",
    "RUN_MODEL_FLOPS_1H",
    "RUN_MODEL_FLOPS_5M",
    "RUN_MODEL_FLOPS_30D",
    "RUN_PEAK_FLOP_SECONDS_1H",
    "RUN_PEAK_FLOP_SECONDS_5M",
    "RUN_PEAK_FLOP_SECONDS_30D",
    "RUN_WATERFALL_5M",
    "RUN_WATERFALL_COUNT_1H",
    "RUN_WATERFALL_COUNT_30D",
    "RUN_WATERFALL_SUM_1H",
    "RUN_WATERFALL_SUM_30D",
    "STEP_FRACTION_5M",
    "WATERFALL_5M",
    "WATERFALL_BASELINE_6H",
    "WATERFALL_GROWTH",
    "WATERFALL_INCREASE_15M",
    "WATERFALL_RUN_BASELINE",
    "WATERFALL_RUN_BASELINE_GROWTH",
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

# The live baseline across runs (`_rules_run_baseline`).
RUN_MODEL_FLOPS_5M = "job:mfuscope_run_model_flops:increase5m"
RUN_PEAK_FLOP_SECONDS_5M = "job:mfuscope_run_peak_flop_seconds:increase5m"
RUN_MODEL_FLOPS_1H = "job:mfuscope_run_model_flops:increase1h"
RUN_PEAK_FLOP_SECONDS_1H = "job:mfuscope_run_peak_flop_seconds:increase1h"
RUN_MODEL_FLOPS_30D = "job:mfuscope_run_model_flops:sum30d"
RUN_PEAK_FLOP_SECONDS_30D = "job:mfuscope_run_peak_flop_seconds:sum30d"
MFU_RUN_BASELINE = "job:mfuscope_mfu:ratio_run_baseline"
RUN_WATERFALL_5M = "job_component:mfuscope_run_waterfall_slice:ratio_rate5m"
RUN_WATERFALL_SUM_1H = "job_component:mfuscope_run_waterfall_slice:sum1h"
RUN_WATERFALL_COUNT_1H = "job_component:mfuscope_run_waterfall_slice:count1h"
RUN_WATERFALL_SUM_30D = "job_component:mfuscope_run_waterfall_slice:sum30d"
RUN_WATERFALL_COUNT_30D = "job_component:mfuscope_run_waterfall_slice:count30d"
WATERFALL_RUN_BASELINE = "job_component:mfuscope_waterfall_slice:ratio_run_baseline"
MFU_BELOW_RUN_BASELINE = "job:mfuscope_mfu_below_run_baseline:ratio"
WATERFALL_RUN_BASELINE_GROWTH = "job_component:mfuscope_waterfall_slice_run_baseline_growth:ratio"

# The job-time ledger (`_rules_job_time`): each category's share of the rank-seconds over the last
# hour, the budget groups MFUScopeJobTimeLost reads, and effective MFU over the job's life and
# the last hour.
JOB_TIME_SHARE_1H = "job_category:mfuscope_job_time:ratio_increase1h"
JOB_TIME_BUDGET_1H = "job_budget:mfuscope_job_time:ratio_increase1h"
EFFECTIVE_MFU = "job:mfuscope_effective_mfu:ratio"
EFFECTIVE_MFU_1H = "job:mfuscope_effective_mfu:ratio_increase1h"
