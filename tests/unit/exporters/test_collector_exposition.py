"""Exposition: exact Prometheus text for a known input, format negotiation, and the data model."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from mfuscope.collector import Aggregator, BadRequest, StateConfig
from mfuscope.collector._routes import HttpRequest, Routes
from mfuscope.exporters.model import HistogramSample, MetricFamily, Sample
from mfuscope.exporters.prometheus import new_registry, render

from tests.support.collector_fakes import FakeClock, batch_dict, report_dict

COLLECTIVES = [
    {
        "op": "all_reduce",
        "axis": "dp",
        "tier": "inter_node",
        "group_size": 2,
        "bytes": 1000,
        "count": 2,
        "seconds": 0.25,
        "overlapped_s": 0.125,
    }
]
TOPOLOGY = {
    "groups": [
        {
            "axis": "dp",
            "tier": "inter_node",
            "size": 2,
            "spans_hosts": True,
            "link_peak_bytes_per_s": 16000.0,
            "link_peak_source": "sysfs",
        }
    ]
}


def known_collector(**config: bool) -> tuple[Aggregator, FakeClock]:
    """Two ranks of job "train": rank 0 sends steps 1-2 (step 1 profiled), rank 1 sends step 1
    twice (one duplicate) and the job's run key (rank 0, an older agent, sends none), and one
    batch is refused."""
    clock = FakeClock()
    collector = Aggregator(StateConfig(**config), clock=clock)
    rank0 = batch_dict(
        job="train",
        rank=0,
        reports=[report_dict(1, collectives=COLLECTIVES), report_dict(2, wall_s=0.5)],
        topology=TOPOLOGY,
        health={"reports_dropped_total": 2, "windows_analysed_total": 1},
    )
    collector.ingest(json.dumps(rank0).encode())
    clock.advance(2)
    rank1 = batch_dict(
        job="train",
        rank=1,
        reports=[report_dict(1, wall_s=2.0, compute_fraction=0.5)],
        topology=TOPOLOGY,
        run_key="fp-0123456789abcdef",
    )
    collector.ingest(json.dumps(rank1).encode())
    collector.ingest(json.dumps(rank1).encode())
    with pytest.raises(BadRequest, match="schema"):
        collector.ingest(b"{}")
    clock.advance(1)
    return collector, clock


# Hand-checked: MFU = (8e11 FLOP / 1.5 s + 4e11 / 2 s) / 2e12 FLOP/s; the straggler is rank 1,
# whose own time (2 s - 1 s exposed) is 1.28x the median of 0.5625 s (rank 0) and 1 s.
EXPECTED = """\
# HELP mfuscope_steps_total step reports accepted
# TYPE mfuscope_steps_total counter
mfuscope_steps_total{job="train"} 3.0
# HELP mfuscope_step_seconds_total sum of step wall time over ranks, seconds
# TYPE mfuscope_step_seconds_total counter
mfuscope_step_seconds_total{job="train"} 3.5
# HELP mfuscope_model_flops_total model FLOPs (the MFU numerator)
# TYPE mfuscope_model_flops_total counter
mfuscope_model_flops_total{job="train"} 1.2e+12
# HELP mfuscope_hardware_flops_total model + recompute FLOPs (the HFU numerator)
# TYPE mfuscope_hardware_flops_total counter
mfuscope_hardware_flops_total{job="train"} 1.5e+12
# HELP mfuscope_peak_flop_seconds_total dense peak FLOP/s of the rank's device x step wall time, summed over steps (the MFU denominator: MFU = increase(model FLOPs) / increase(this) over any range)
# TYPE mfuscope_peak_flop_seconds_total counter
mfuscope_peak_flop_seconds_total{job="train"} 3.5e+12
# HELP mfuscope_overlapped_comm_seconds_total communication hidden under compute, seconds
# TYPE mfuscope_overlapped_comm_seconds_total counter
mfuscope_overlapped_comm_seconds_total{job="train"} 0.0
# HELP mfuscope_reports_duplicate_total re-sent step reports acknowledged and not counted
# TYPE mfuscope_reports_duplicate_total counter
mfuscope_reports_duplicate_total{job="train"} 1.0
# HELP mfuscope_rerun_steps_total step reports accepted whose step an earlier launch of the job had already reported (work redone after a restart; also in mfuscope_steps_total)
# TYPE mfuscope_rerun_steps_total counter
mfuscope_rerun_steps_total{job="train"} 0.0
# HELP mfuscope_useful_model_flops_total model FLOPs of the steps that advanced training (redone steps left out): the effective MFU numerator
# TYPE mfuscope_useful_model_flops_total counter
mfuscope_useful_model_flops_total{job="train"} 1.2e+12
# HELP mfuscope_job_peak_flop_seconds_total dense peak FLOP/s of the rank's device x its rank-seconds in every job-time category, summed (the effective MFU denominator: effective MFU = increase(useful model FLOPs) / increase(this))
# TYPE mfuscope_job_peak_flop_seconds_total counter
mfuscope_job_peak_flop_seconds_total{job="train"} 0.0
# HELP mfuscope_job_restarts_total new launches of the job (agent incarnations) after the first one seen
# TYPE mfuscope_job_restarts_total counter
mfuscope_job_restarts_total{job="train"} 0.0
# HELP mfuscope_job_rank_seconds_total each rank's seconds from its process start to its exit, by job-time category (startup, step, redone_step, checkpoint_save, checkpoint_load, evaluation, other_phase, hung, down, shutdown): the categories sum to the ranks' rank-seconds
# TYPE mfuscope_job_rank_seconds_total counter
mfuscope_job_rank_seconds_total{category="startup",job="train"} 0.0
mfuscope_job_rank_seconds_total{category="step",job="train"} 0.0
mfuscope_job_rank_seconds_total{category="redone_step",job="train"} 0.0
mfuscope_job_rank_seconds_total{category="checkpoint_save",job="train"} 0.0
mfuscope_job_rank_seconds_total{category="checkpoint_load",job="train"} 0.0
mfuscope_job_rank_seconds_total{category="evaluation",job="train"} 0.0
mfuscope_job_rank_seconds_total{category="other_phase",job="train"} 0.0
mfuscope_job_rank_seconds_total{category="hung",job="train"} 0.0
mfuscope_job_rank_seconds_total{category="down",job="train"} 0.0
mfuscope_job_rank_seconds_total{category="shutdown",job="train"} 0.0
# HELP mfuscope_step_component_seconds_total step time per bucket (compute, recompute, exposed_comm, other, bubble_pipeline, bubble_idle, instrumentation); axis and tier set on exposed_comm, axis pp on bubble_pipeline, seconds
# TYPE mfuscope_step_component_seconds_total counter
mfuscope_step_component_seconds_total{axis="",component="compute",job="train",tier=""} 2.125
mfuscope_step_component_seconds_total{axis="dp",component="exposed_comm",job="train",tier="intra_node"} 1.375
# HELP mfuscope_compute_class_seconds_total compute time per kernel class (gemm, attention, elementwise_norm_reduce, other), from profiled windows; sums to the compute component over the steps that carry it, seconds
# TYPE mfuscope_compute_class_seconds_total counter
# HELP mfuscope_collective_calls_total collective and point-to-point calls: every completed call (always-on flight-recorder records), or those in profiled windows for ranks without records
# TYPE mfuscope_collective_calls_total counter
mfuscope_collective_calls_total{axis="dp",job="train",op="all_reduce",tier="inter_node"} 2.0
# HELP mfuscope_collective_bytes_total collective size S (nccl-tests definition) of the calls whose size is known, bytes (same sources as calls)
# TYPE mfuscope_collective_bytes_total counter
mfuscope_collective_bytes_total{axis="dp",job="train",op="all_reduce",tier="inter_node"} 2000.0
# HELP mfuscope_collective_bus_bytes_total collective size S x nccl-tests bus factor, bytes (same sources as calls)
# TYPE mfuscope_collective_bus_bytes_total counter
mfuscope_collective_bus_bytes_total{axis="dp",job="train",op="all_reduce",tier="inter_node"} 2000.0
# HELP mfuscope_collective_seconds_total collective duration, seconds: always-on where the backend times collectives (NCCL with timing), else from profiled windows
# TYPE mfuscope_collective_seconds_total counter
mfuscope_collective_seconds_total{axis="dp",job="train",op="all_reduce",tier="inter_node"} 0.25
# HELP mfuscope_collective_sized_seconds_total duration of the collective calls whose size and group size are known (the busbw denominator), seconds (same sources as seconds)
# TYPE mfuscope_collective_sized_seconds_total counter
mfuscope_collective_sized_seconds_total{axis="dp",job="train",op="all_reduce",tier="inter_node"} 0.25
# HELP mfuscope_collective_sized_bus_bytes_total bus bytes of exactly the calls in sized_seconds (the busbw numerator: busbw = rate(sized_bus_bytes) / rate(sized_seconds)), bytes
# TYPE mfuscope_collective_sized_bus_bytes_total counter
mfuscope_collective_sized_bus_bytes_total{axis="dp",job="train",op="all_reduce",tier="inter_node"} 2000.0
# HELP mfuscope_collective_overlapped_seconds_total collective time hidden under compute, seconds (profiled windows)
# TYPE mfuscope_collective_overlapped_seconds_total counter
mfuscope_collective_overlapped_seconds_total{axis="dp",job="train",op="all_reduce",tier="inter_node"} 0.125
# HELP mfuscope_collective_profiled_seconds_total collective time inside profiled windows (what overlapped_seconds is a part of), seconds
# TYPE mfuscope_collective_profiled_seconds_total counter
mfuscope_collective_profiled_seconds_total{axis="dp",job="train",op="all_reduce",tier="inter_node"} 0.25
# HELP mfuscope_step_duration_seconds per-rank step wall time, seconds
# TYPE mfuscope_step_duration_seconds histogram
mfuscope_step_duration_seconds_bucket{job="train",le="0.01"} 0.0
mfuscope_step_duration_seconds_bucket{job="train",le="0.025"} 0.0
mfuscope_step_duration_seconds_bucket{job="train",le="0.05"} 0.0
mfuscope_step_duration_seconds_bucket{job="train",le="0.1"} 0.0
mfuscope_step_duration_seconds_bucket{job="train",le="0.25"} 0.0
mfuscope_step_duration_seconds_bucket{job="train",le="0.5"} 1.0
mfuscope_step_duration_seconds_bucket{job="train",le="1.0"} 2.0
mfuscope_step_duration_seconds_bucket{job="train",le="2.5"} 3.0
mfuscope_step_duration_seconds_bucket{job="train",le="5.0"} 3.0
mfuscope_step_duration_seconds_bucket{job="train",le="10.0"} 3.0
mfuscope_step_duration_seconds_bucket{job="train",le="30.0"} 3.0
mfuscope_step_duration_seconds_bucket{job="train",le="60.0"} 3.0
mfuscope_step_duration_seconds_bucket{job="train",le="120.0"} 3.0
mfuscope_step_duration_seconds_bucket{job="train",le="300.0"} 3.0
mfuscope_step_duration_seconds_bucket{job="train",le="+Inf"} 3.0
mfuscope_step_duration_seconds_count{job="train"} 3.0
mfuscope_step_duration_seconds_sum{job="train"} 3.5
# HELP mfuscope_reports_dropped_total reports the agents dropped (the agents' cumulative counts, kept across rank expiry and agent restarts)
# TYPE mfuscope_reports_dropped_total counter
mfuscope_reports_dropped_total{job="train"} 2.0
# HELP mfuscope_agent_send_failures_total send attempts of the agents that failed (the agents' cumulative counts, kept across rank expiry and agent restarts)
# TYPE mfuscope_agent_send_failures_total counter
mfuscope_agent_send_failures_total{job="train"} 0.0
# HELP mfuscope_profiler_failures_total profiled windows the agents failed to analyse (the agents' cumulative counts, kept across rank expiry and agent restarts)
# TYPE mfuscope_profiler_failures_total counter
mfuscope_profiler_failures_total{job="train"} 0.0
# HELP mfuscope_agent_windows_analysed_total profiled windows the agents analysed (the agents' cumulative counts, kept across rank expiry and agent restarts)
# TYPE mfuscope_agent_windows_analysed_total counter
mfuscope_agent_windows_analysed_total{job="train"} 1.0
# HELP mfuscope_peak_flops dense peak FLOP/s of the live ranks' devices (summed per job)
# TYPE mfuscope_peak_flops gauge
mfuscope_peak_flops{job="train"} 2e+12
# HELP mfuscope_last_report_age_seconds seconds since the latest report of the most silent live rank whose agent has not closed
# TYPE mfuscope_last_report_age_seconds gauge
mfuscope_last_report_age_seconds{job="train"} 3.0
# HELP mfuscope_breakdown_age_seconds seconds since the collector received the newest profiled window of any live rank: the age of the step breakdown and of the collective figures that come only from windows (absent before the first window)
# TYPE mfuscope_breakdown_age_seconds gauge
mfuscope_breakdown_age_seconds{job="train"} 3.0
# HELP mfuscope_breakdown_spread_ratio how far a carried breakdown can be off: the largest spread (max - min) of exposed communication's share of the step between the latest profiled windows of any live rank (absent before a rank has two windows)
# TYPE mfuscope_breakdown_spread_ratio gauge
# HELP mfuscope_ranks live ranks reporting to this collector
# TYPE mfuscope_ranks gauge
mfuscope_ranks{job="train"} 2.0
# HELP mfuscope_world_size world size the ranks report
# TYPE mfuscope_world_size gauge
mfuscope_world_size{job="train"} 2.0
# HELP mfuscope_peak_flops_unknown_ranks live ranks whose device peak FLOP/s is unknown
# TYPE mfuscope_peak_flops_unknown_ranks gauge
mfuscope_peak_flops_unknown_ranks{job="train"} 0.0
# HELP mfuscope_tp_spans_hosts 1 when a tensor-parallel group spans hosts
# TYPE mfuscope_tp_spans_hosts gauge
mfuscope_tp_spans_hosts{job="train"} 0.0
# HELP mfuscope_run_info 1 with the job's run key: which runs are the same workload (by default a fingerprint of model FLOPs per step, world size, layout, device and dtype), for the baseline across runs
# TYPE mfuscope_run_info gauge
mfuscope_run_info{job="train",run_key="fp-0123456789abcdef"} 1.0
# HELP mfuscope_mfu_ratio MFU over each live rank's latest window of steps
# TYPE mfuscope_mfu_ratio gauge
mfuscope_mfu_ratio{job="train"} 0.36666666666666664
# HELP mfuscope_hfu_ratio HFU over each live rank's latest window of steps
# TYPE mfuscope_hfu_ratio gauge
mfuscope_hfu_ratio{job="train"} 0.4583333333333333
# HELP mfuscope_step_component_ratio fraction of step time per bucket, from each rank's latest breakdown
# TYPE mfuscope_step_component_ratio gauge
mfuscope_step_component_ratio{axis="",component="compute",job="train",tier=""} 0.55
mfuscope_step_component_ratio{axis="dp",component="exposed_comm",job="train",tier="intra_node"} 0.45
# HELP mfuscope_tier_peak_bandwidth_bytes_per_second spec unidirectional link rate of the groups on this axis and tier, bytes/s
# TYPE mfuscope_tier_peak_bandwidth_bytes_per_second gauge
mfuscope_tier_peak_bandwidth_bytes_per_second{axis="dp",job="train",tier="inter_node"} 16000.0
# HELP mfuscope_tier_peak_info 1 for each link spec source stated on this axis and tier (datasheet, sysfs, nvml, user, or unknown: no spec, so no efficiency)
# TYPE mfuscope_tier_peak_info gauge
mfuscope_tier_peak_info{axis="dp",job="train",source="sysfs",tier="inter_node"} 1.0
# HELP mfuscope_collective_bus_bandwidth_bytes_per_second nccl-tests bus bandwidth over each rank's latest profiled step, bytes/s
# TYPE mfuscope_collective_bus_bandwidth_bytes_per_second gauge
mfuscope_collective_bus_bandwidth_bytes_per_second{axis="dp",job="train",tier="inter_node"} 8000.0
# HELP mfuscope_collective_bus_bandwidth_ratio bus bandwidth / the tier's spec peak (only where the peak is known)
# TYPE mfuscope_collective_bus_bandwidth_ratio gauge
mfuscope_collective_bus_bandwidth_ratio{axis="dp",job="train",tier="inter_node"} 0.5
# HELP mfuscope_straggler_ratio recent step time of the slowest ranks / median over the job's ranks
# TYPE mfuscope_straggler_ratio gauge
mfuscope_straggler_ratio{host="node-0",job="train",node="node-0",rank="1"} 1.28
# HELP mfuscope_link_bytes_total bytes moved per link kind (nvlink, pcie: the ranks' GPUs; ib, roce, ethernet: the nodes' NICs, once per node) and direction, from hardware counters
# TYPE mfuscope_link_bytes_total counter
# HELP mfuscope_device_clock_throttle_seconds_total seconds the ranks' GPUs ran with the SM clock held down, per NVML clock-event reason (summed over GPUs; sampled about once a second)
# TYPE mfuscope_device_clock_throttle_seconds_total counter
# HELP mfuscope_device_energy_joules_total energy the ranks' GPUs used while their agents ran, joules
# TYPE mfuscope_device_energy_joules_total counter
# HELP mfuscope_device_memory_busy_ratio fraction of time device memory (HBM) was read or written, latest sample (mean over ranks)
# TYPE mfuscope_device_memory_busy_ratio gauge
# HELP mfuscope_device_sm_clock_ratio SM clock / maximum SM clock, latest sample (mean over ranks)
# TYPE mfuscope_device_sm_clock_ratio gauge
# HELP mfuscope_device_power_watts board power draw of the ranks' GPUs, latest sample (summed), watts
# TYPE mfuscope_device_power_watts gauge
# HELP mfuscope_link_peak_bandwidth_bytes_per_second spec unidirectional rate of the links the hardware counters cover (summed over the live ranks' GPUs, and over the nodes' NIC ports), bytes/s
# TYPE mfuscope_link_peak_bandwidth_bytes_per_second gauge
# HELP mfuscope_collective_blocked_ranks live ranks waiting 10 s or more in a collective (each under its longest wait)
# TYPE mfuscope_collective_blocked_ranks gauge
# HELP mfuscope_collective_blocked_seconds longest wait of a blocked rank in a collective, seconds
# TYPE mfuscope_collective_blocked_seconds gauge
# HELP mfuscope_collective_hang_suspect_seconds a rank the blocked ranks wait for (reason not_joined: it never entered collective seq; desync: it entered another op there, or waits in a cycle), and how long the longest of them has waited, seconds
# TYPE mfuscope_collective_hang_suspect_seconds gauge
# HELP mfuscope_collective_hang_suspects ranks the blocked ranks wait for (all of them; the suspect series lists the first)
# TYPE mfuscope_collective_hang_suspects gauge
# HELP mfuscope_collective_group_waiting_seq sequence number of the collective this collector's blocked ranks wait in, per process group (the rules join it with the entered sequence numbers of every collector's ranks)
# TYPE mfuscope_collective_group_waiting_seq gauge
# HELP mfuscope_collective_group_waiting_seconds longest wait of this collector's blocked ranks in that collective, seconds
# TYPE mfuscope_collective_group_waiting_seconds gauge
# HELP mfuscope_collective_group_entered_seq highest collective sequence number a rank that is not blocked entered in a process group, while its step is overdue or a rank of this collector is blocked
# TYPE mfuscope_collective_group_entered_seq gauge
# HELP mfuscope_collective_arrival_skew_seconds smoothed spread of the ranks' enqueue times of one collective, seconds (across hosts it includes their clock offset)
# TYPE mfuscope_collective_arrival_skew_seconds gauge
# HELP mfuscope_collective_arrival_lateness_seconds smoothed time the latest-arriving ranks enter collectives after their groups' median, seconds
# TYPE mfuscope_collective_arrival_lateness_seconds gauge
# HELP mfuscope_collective_arrival_seq sequence number of the collective of the rank's held arrival sample, for groups whose ranks report to several collectors
# TYPE mfuscope_collective_arrival_seq gauge
# HELP mfuscope_collective_arrival_enqueued_seconds when the rank enqueued that collective, by its host's wall clock, seconds since the epoch
# TYPE mfuscope_collective_arrival_enqueued_seconds gauge
# HELP mfuscope_collective_group_size ranks in a process group whose ranks report to several collectors
# TYPE mfuscope_collective_group_size gauge
# HELP mfuscope_collective_records_lost_total flight-recorder entries overwritten before an agent read them (missing from the collective counters)
# TYPE mfuscope_collective_records_lost_total counter
mfuscope_collective_records_lost_total{job="train"} 0.0
# HELP mfuscope_reports_rejected_total batches the collector refused, by reason
# TYPE mfuscope_reports_rejected_total counter
mfuscope_reports_rejected_total{reason="content_type"} 0.0
mfuscope_reports_rejected_total{reason="invalid"} 1.0
mfuscope_reports_rejected_total{reason="rate_limited"} 0.0
mfuscope_reports_rejected_total{reason="too_large"} 0.0
mfuscope_reports_rejected_total{reason="too_many_axes"} 0.0
mfuscope_reports_rejected_total{reason="too_many_jobs"} 0.0
mfuscope_reports_rejected_total{reason="too_many_ranks"} 0.0
mfuscope_reports_rejected_total{reason="unauthorized"} 0.0
mfuscope_reports_rejected_total{reason="version"} 0.0
"""  # noqa: E501


def test_exact_exposition_text_for_a_known_input() -> None:
    collector, _ = known_collector()
    response = Routes(collector).handle(HttpRequest("GET", "/metrics", "127.0.0.1"), b"")
    assert response.content_type == "text/plain; version=0.0.4; charset=utf-8"
    assert response.body.decode() == EXPECTED


def test_openmetrics_when_the_scraper_asks_for_it() -> None:
    collector, _ = known_collector()
    request = HttpRequest(
        "GET", "/metrics", "127.0.0.1", accept="application/openmetrics-text; version=1.0.0"
    )
    response = Routes(collector).handle(request, b"")
    text = response.body.decode()
    assert response.content_type.startswith("application/openmetrics-text; version=1.0.0")
    assert text.endswith("# EOF\n")
    assert 'mfuscope_steps_total{job="train"} 3.0' in text


def test_per_rank_labels_split_counters_by_rank() -> None:
    collector, _ = known_collector(per_rank_labels=True)
    text, _ = render(new_registry(collector.families))
    lines = text.decode().splitlines()
    assert 'mfuscope_steps_total{job="train",rank="0"} 2.0' in lines
    assert 'mfuscope_steps_total{job="train",rank="1"} 1.0' in lines
    assert 'mfuscope_reports_dropped_total{job="train",rank="0"} 2.0' in lines
    assert 'mfuscope_last_report_age_seconds{job="train",rank="1"} 1.0' in lines
    assert 'mfuscope_ranks{job="train"} 2.0' in lines  # job-level gauges keep job only


def test_histogram_buckets_render_cumulatively() -> None:
    family = MetricFamily(
        name="x_seconds",
        kind="histogram",
        help="h",
        unit="s",
        label_names=("job",),
        bounds=(0.5, 1.0),
        histogram_samples=(HistogramSample(("j",), (1, 0, 2), sum=7.5, min=0.1, max=3.0),),
    )
    text, _ = render(new_registry(lambda: [family]))
    assert text.decode().splitlines()[2:] == [
        'x_seconds_bucket{job="j",le="0.5"} 1.0',
        'x_seconds_bucket{job="j",le="1.0"} 1.0',
        'x_seconds_bucket{job="j",le="+Inf"} 3.0',
        'x_seconds_count{job="j"} 3.0',
        'x_seconds_sum{job="j"} 7.5',
    ]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"name": "bad-name", "kind": "gauge"}, "invalid metric name"),
        ({"name": "x", "kind": "counter"}, "_total"),
        ({"name": "x_total", "kind": "gauge"}, "_total"),
        ({"name": "x", "kind": "gauge", "label_names": ("le",)}, "label"),
        ({"name": "x", "kind": "gauge", "samples": (Sample(("a",), 1.0),)}, "sample labels"),
        ({"name": "x", "kind": "histogram", "bounds": (1.0, 0.5)}, "increasing"),
        ({"name": "x", "kind": "gauge", "bounds": (1.0,)}, "only histograms"),
        (
            {
                "name": "x",
                "kind": "histogram",
                "bounds": (1.0,),
                "histogram_samples": (HistogramSample((), (1,), 1.0, 1.0, 1.0),),
            },
            "buckets",
        ),
    ],
)
def test_family_misuse_raises_at_once(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        MetricFamily(help="h", unit="1", **{"label_names": (), **kwargs})  # type: ignore[arg-type]


def test_otlp_names_drop_the_counter_suffix() -> None:
    counter = MetricFamily("a_total", "counter", "h", "1", ())
    gauge = MetricFamily("b_ratio", "gauge", "h", "1", ())
    assert (counter.otlp_name, gauge.otlp_name) == ("a", "b_ratio")


def _contract() -> dict[str, tuple[str, frozenset[str]]]:
    """The metric contract (docs/reference/metrics.md): name -> (type, labels without per-rank
    labels)."""
    root = Path(__file__).resolve().parents[3]
    table = (root / "docs" / "reference" / "metrics.md").read_text(encoding="utf-8")
    rows = re.findall(
        r"^\| `(mfuscope_[a-z0-9_]+)` \| (\w+) \| ([a-z_, ]*)[ (|]", table, flags=re.MULTILINE
    )
    return {
        name: (kind, frozenset(label.strip() for label in labels.split(",") if label.strip()))
        for name, kind, labels in rows
    }


def test_exposed_families_are_exactly_the_contract() -> None:
    # The generated table is the public contract: every family the collector exposes is in it with
    # the same type and labels (rank only with per-rank labels), and nothing in it is missing.
    contract = _contract()
    for per_rank in (False, True):
        collector, _ = known_collector(per_rank_labels=per_rank)
        exposed = {f.name: (f.kind, set(f.label_names)) for f in collector.families()}
        assert set(exposed) == set(contract)
        for name, (kind, labels) in exposed.items():
            assert kind == contract[name][0], name
            assert labels - {"rank"} == contract[name][1] - {"rank"}, name
            assert per_rank or "rank" not in labels or "rank" in contract[name][1], name
