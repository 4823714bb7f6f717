"""Hardware counters in the wire schema (optional, since 1.1) and the wrap-around arithmetic."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from mfuscope.core import schema as s
from mfuscope.core.hwcounters import (
    HardwareCounters,
    LinkBytes,
    LinkPeak,
    ThrottleTime,
    counter_delta,
)

from tests.support.collector_fakes import batch_dict
from tests.support.wire import decode_value

HARDWARE: dict[str, Any] = {
    "memory_busy_ratio": 0.4,
    "sm_clock_ratio": 0.9,
    "power_watts": 650.0,
    "energy_joules_total": 1234.5,
    "links": [
        {"link": "nvlink", "direction": "tx", "bytes_total": 10},
        {"link": "ib", "direction": "rx", "bytes_total": 4},
    ],
    "link_peaks": [{"link": "nvlink", "bytes_per_s": 4.5e11}],
    "throttle": [{"reason": "sw_power_cap", "seconds_total": 2.0}],
}


@pytest.mark.parametrize(
    ("previous", "current", "width", "delta"),
    [
        (10, 15, 32, 5),
        ((1 << 32) - 100, 50, 32, 150),  # wrapped once
        (1 << 40, 7, None, 7),  # a 64-bit counter that went down was reset
        (5, 5, 32, 0),
    ],
)
def test_counter_delta(previous: int, current: int, width: int | None, delta: int) -> None:
    assert counter_delta(previous, current, width) == delta


@given(st.integers(0, (1 << 32) - 1), st.integers(0, (1 << 32) - 1))
def test_one_wrap_is_undone(start: int, increase: int) -> None:
    current = (start + increase) % (1 << 32)
    assert counter_delta(start, current, 32) == increase


def test_hardware_round_trip_and_version() -> None:
    batch = decode_value(batch_dict(hardware=HARDWARE))
    assert s.SCHEMA_VERSION == "1.4"
    assert batch.hardware == HardwareCounters(
        memory_busy_ratio=0.4,
        sm_clock_ratio=0.9,
        power_watts=650.0,
        energy_joules_total=1234.5,
        links=(LinkBytes("nvlink", "tx", 10), LinkBytes("ib", "rx", 4)),
        link_peaks=(LinkPeak("nvlink", 4.5e11),),
        throttle=(ThrottleTime("sw_power_cap", 2.0),),
    )
    assert s.decode_batch(s.encode_batch(batch)) == batch


def test_batches_without_hardware_stay_valid() -> None:
    old = batch_dict(version="1.0")
    assert decode_value(old).hardware is None
    assert decode_value(batch_dict(hardware={})).hardware == HardwareCounters()


def _with(path: tuple[Any, ...], value: Any) -> dict[str, Any]:
    hardware = copy.deepcopy(HARDWARE)
    target: Any = hardware
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    return batch_dict(hardware=hardware)


@pytest.mark.parametrize(
    ("path", "value", "field"),
    [
        (("memory_busy_ratio",), 1.5, "hardware.memory_busy_ratio"),
        (("sm_clock_ratio",), -0.1, "hardware.sm_clock_ratio"),
        (("power_watts",), float("nan"), "hardware.power_watts"),
        (("links", 0, "link"), "infiniband", "hardware.links[0].link"),
        (("links", 0, "direction"), "both", "hardware.links[0].direction"),
        (("links", 1, "bytes_total"), -4, "hardware.links[1].bytes_total"),
        (("links", 1, "link"), "nvlink", "hardware.links"),  # made (nvlink, tx) twice below
        (("throttle", 0, "reason"), "power cap!", "hardware.throttle[0].reason"),
        (("throttle", 0, "seconds_total"), -1.0, "hardware.throttle[0].seconds_total"),
        (("link_peaks", 0, "bytes_per_s"), "fast", "hardware.link_peaks[0].bytes_per_s"),
    ],
)
def test_bad_hardware_fields_are_named(path: tuple[Any, ...], value: Any, field: str) -> None:
    raw = _with(path, value)
    if field == "hardware.links":
        raw["hardware"]["links"][1]["direction"] = "tx"  # now (nvlink, tx) appears twice
    with pytest.raises(s.SchemaError) as info:
        decode_value(raw)
    assert info.value.field == field
