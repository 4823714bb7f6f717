"""Hardware counters in the collector: restart-adjusted totals, gauges over live ranks, absence."""

from __future__ import annotations

import json
from typing import Any

import pytest
from mfuscope.collector import Aggregator, StateConfig

from tests.support.collector_fakes import FakeClock, batch_dict

Values = dict[tuple[str, tuple[str, ...]], float]


def _hardware(
    nvlink_tx: int, throttle_s: float, *, busy: float = 0.5, watts: float = 600.0
) -> dict[str, Any]:
    return {
        "memory_busy_ratio": busy,
        "sm_clock_ratio": 0.8,
        "power_watts": watts,
        "energy_joules_total": 10.0 * nvlink_tx,
        "links": [{"link": "nvlink", "direction": "tx", "bytes_total": nvlink_tx}],
        "link_peaks": [{"link": "nvlink", "bytes_per_s": 4.5e11}],
        "throttle": [{"reason": "sw_power_cap", "seconds_total": throttle_s}],
    }


def _send(collector: Aggregator, rank: int, step: int, hardware: dict[str, Any] | None) -> None:
    fields = {} if hardware is None else {"hardware": hardware}
    body = batch_dict(rank=rank, world_size=4, steps=[step], **fields)
    collector.ingest(json.dumps(body).encode())


def _values(collector: Aggregator) -> Values:
    return {
        (f.name, s.labels): s.value
        for f in collector.families()
        if f.name.startswith(("mfuscope_device_", "mfuscope_link_"))
        for s in f.samples
    }


def test_totals_sum_over_ranks_and_survive_restarts_and_expiry() -> None:
    clock = FakeClock()
    collector = Aggregator(StateConfig(expire_after_s=30.0), clock=clock)
    _send(collector, 0, 1, _hardware(100, 1.0))
    _send(collector, 1, 1, _hardware(50, 0.0, busy=0.3, watts=500.0))
    values = _values(collector)
    assert values[("mfuscope_link_bytes_total", ("job-a", "nvlink", "tx"))] == 150
    assert values[("mfuscope_device_clock_throttle_seconds_total", ("job-a", "sw_power_cap"))] == 1
    assert values[("mfuscope_device_memory_busy_ratio", ("job-a",))] == pytest.approx(0.4)
    assert values[("mfuscope_device_power_watts", ("job-a",))] == 1100.0
    assert values[("mfuscope_link_peak_bandwidth_bytes_per_second", ("job-a", "nvlink"))] == 9e11

    _send(collector, 0, 2, _hardware(30, 0.5))  # rank 0's agent restarted: totals from zero
    assert _values(collector)[("mfuscope_link_bytes_total", ("job-a", "nvlink", "tx"))] == 180

    clock.advance(20.0)
    _send(collector, 0, 3, _hardware(40, 0.5))
    clock.advance(20.0)  # rank 1 expires: its bytes stay counted, its gauges go
    values = _values(collector)
    assert values[("mfuscope_link_bytes_total", ("job-a", "nvlink", "tx"))] == 190
    assert values[("mfuscope_device_power_watts", ("job-a",))] == 600.0


def test_per_rank_labels() -> None:
    collector = Aggregator(StateConfig(per_rank_labels=True), clock=FakeClock())
    _send(collector, 2, 1, _hardware(7, 0.25))
    values = _values(collector)
    assert values[("mfuscope_link_bytes_total", ("job-a", "2", "nvlink", "tx"))] == 7
    assert values[("mfuscope_device_sm_clock_ratio", ("job-a", "2"))] == 0.8


def test_no_counters_means_no_series() -> None:
    collector = Aggregator(StateConfig(), clock=FakeClock())
    _send(collector, 0, 1, None)
    _send(collector, 1, 1, {"memory_busy_ratio": 0.2})
    values = _values(collector)
    assert values == {("mfuscope_device_memory_busy_ratio", ("job-a",)): 0.2}
