"""Hardware counters of one rank: the wire records and the counter arithmetic, torch-free.

The agent's sampler (`mfuscope.agent.hwcounters`) reads the device and NIC counters about once a
second and ships a `HardwareCounters` record with every batch; the collector turns the records
into the ``mfuscope_device_*`` and ``mfuscope_link_bytes_total`` series (the README's metric
contract). Units are base units: bytes, seconds, watts, joules, ratios 0..1.

Totals are cumulative since the rank's sampler started (so a restarted agent starts again from
zero, which the collector detects, as for the agent-health counters). A counter the rank cannot
read is left out of the record, never sent as zero: "no NVLink counters" and "no NVLink traffic"
are different facts.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from mfuscope.core._fields import choice, integer, number, required, text
from mfuscope.core._fields import entries as entries_list
from mfuscope.core._fields import obj as mapping
from mfuscope.core.errors import SchemaError

__all__ = [
    "HARDWARE_LINKS",
    "LINK_DIRECTIONS",
    "MAX_LINK_ENTRIES",
    "MAX_THROTTLE_REASONS",
    "HardwareCounters",
    "LinkBytes",
    "LinkPeak",
    "ThrottleTime",
    "counter_delta",
    "parse_hardware",
]

# The `link` label of `mfuscope_link_bytes_total`: NVLink and PCIe of the rank's GPU; the node's
# InfiniBand ports, RoCE ports (RDMA over an Ethernet link layer) and plain Ethernet interfaces.
HARDWARE_LINKS: tuple[str, ...] = ("nvlink", "pcie", "ib", "roce", "ethernet")
LINK_DIRECTIONS: tuple[str, ...] = ("tx", "rx")
MAX_LINK_ENTRIES = len(HARDWARE_LINKS) * len(LINK_DIRECTIONS)
MAX_THROTTLE_REASONS = 16


@dataclass(frozen=True)
class LinkBytes:
    """Bytes moved on one link kind in one direction since the sampler started."""

    link: str
    direction: str
    bytes_total: int


@dataclass(frozen=True)
class LinkPeak:
    """The spec unidirectional rate of the links the rank's counters cover, bytes/s."""

    link: str
    bytes_per_s: float


@dataclass(frozen=True)
class ThrottleTime:
    """Seconds the SM clock was held down for `reason` since the sampler started."""

    reason: str
    seconds_total: float


@dataclass(frozen=True)
class HardwareCounters:
    """One rank's hardware counters; None / empty means the rank cannot read that counter.

    - `memory_busy_ratio`: fraction of the last sample period during which device memory (HBM)
      was being read or written (NVML utilisation ``memory``), 0..1;
    - `sm_clock_ratio`: current SM clock / maximum SM clock, 0..1;
    - `power_watts`: board power draw, W; `energy_joules_total`: energy used, J;
    - `links`, `link_peaks`, `throttle`: see their records.
    """

    memory_busy_ratio: float | None = None
    sm_clock_ratio: float | None = None
    power_watts: float | None = None
    energy_joules_total: float | None = None
    links: tuple[LinkBytes, ...] = ()
    link_peaks: tuple[LinkPeak, ...] = ()
    throttle: tuple[ThrottleTime, ...] = ()


def counter_delta(previous: int, current: int, width_bits: int | None) -> int:
    """The increase of a hardware counter between two reads, in the counter's own units.

    A counter `width_bits` wide wraps to zero after ``2**width_bits - 1``: a read lower than the
    previous one then means it wrapped, and we assume once (a counter that wraps more than once
    between two reads under-counts; docs/agent.md says which counters can). Without a known width
    (`None`), a lower read means the counter was reset (driver reload, ``perfquery -R``) and the
    new value is the increase since the reset.
    """
    if current >= previous:
        return current - previous
    if width_bits is None:
        return current
    return current + (1 << width_bits) - previous


# --- parsing the wire record -----------------------------------------------------------------


def _ratio(obj: Mapping[str, Any], name: str) -> float | None:
    value = obj.get(name)
    return None if value is None else number(value, f"hardware.{name}", hi=1.0)


def _entries(obj: Mapping[str, Any], key: str, max_len: int) -> list[tuple[str, Mapping[str, Any]]]:
    """``(path, object)`` of each entry of the optional list `obj[key]` of the hardware record."""
    raw = entries_list(obj.get(key, []), f"hardware.{key}", max_len)
    return [(f"hardware.{key}[{i}]", mapping(e, f"hardware.{key}[{i}]")) for i, e in enumerate(raw)]


def _reason(value: Any, path: str) -> str:
    # Any short snake_case name: a newer agent may know a reason this collector does not.
    reason = text(value, path)
    if len(reason) > 32 or not reason.replace("_", "").isalnum():
        raise SchemaError(path, f"{reason!r} is not a short snake_case name")
    return reason


def parse_hardware(raw: Any) -> HardwareCounters | None:
    """The batch's optional ``hardware`` record (None when absent); `SchemaError` names a bad
    field."""
    if raw is None:
        return None
    obj = mapping(raw, "hardware")
    links = [
        LinkBytes(
            link=choice(required(e, "link", f"{p}."), f"{p}.link", HARDWARE_LINKS),
            direction=choice(required(e, "direction", f"{p}."), f"{p}.direction", LINK_DIRECTIONS),
            bytes_total=integer(required(e, "bytes_total", f"{p}."), f"{p}.bytes_total"),
        )
        for p, e in _entries(obj, "links", MAX_LINK_ENTRIES)
    ]
    peaks = [
        LinkPeak(
            link=choice(required(e, "link", f"{p}."), f"{p}.link", HARDWARE_LINKS),
            bytes_per_s=number(required(e, "bytes_per_s", f"{p}."), f"{p}.bytes_per_s", hi=1e15),
        )
        for p, e in _entries(obj, "link_peaks", MAX_LINK_ENTRIES)
    ]
    throttle = [
        ThrottleTime(
            reason=_reason(required(e, "reason", f"{p}."), f"{p}.reason"),
            seconds_total=number(required(e, "seconds_total", f"{p}."), f"{p}.seconds_total"),
        )
        for p, e in _entries(obj, "throttle", MAX_THROTTLE_REASONS)
    ]
    for name, keys in (
        ("links", [(x.link, x.direction) for x in links]),
        ("link_peaks", [(x.link,) for x in peaks]),
        ("throttle", [(x.reason,) for x in throttle]),
    ):
        if len(set(keys)) != len(keys):
            raise SchemaError(f"hardware.{name}", "the same entry appears twice")
    power = obj.get("power_watts")
    energy = obj.get("energy_joules_total")
    return HardwareCounters(
        memory_busy_ratio=_ratio(obj, "memory_busy_ratio"),
        sm_clock_ratio=_ratio(obj, "sm_clock_ratio"),
        power_watts=None if power is None else number(power, "hardware.power_watts", hi=1e5),
        energy_joules_total=None
        if energy is None
        else number(energy, "hardware.energy_joules_total"),
        links=tuple(links),
        link_peaks=tuple(peaks),
        throttle=tuple(throttle),
    )
