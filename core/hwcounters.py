"""Hardware counters of one rank: the wire records and the counter arithmetic, torch-free.

The agent's sampler (`mfuscope.agent.hwcounters`) reads the device and NIC counters about once a
second and ships a `HardwareCounters` record with every batch; the collector turns the records
into the ``mfuscope_device_*`` and ``mfuscope_link_bytes_total`` series
(docs/reference/metrics.md). Units are base units: bytes, seconds, watts, joules, ratios 0..1.

Totals are cumulative since the rank's sampler started (so a restarted agent starts again from
zero, which the collector detects, as for the agent-health counters). A counter the rank cannot
read is left out of the record, never sent as zero: "no NVLink counters" and "no NVLink traffic"
are different facts.
"""

from __future__ import annotations

from typing import Annotated

from mfuscope.core._fields import Count, choice, number
from mfuscope.core.errors import SchemaError
from msgspec import Meta, Struct

__all__ = [
    "HARDWARE_LINKS",
    "LINK_DIRECTIONS",
    "MAX_LINK_ENTRIES",
    "MAX_THROTTLE_REASONS",
    "HardwareCounters",
    "LinkBytes",
    "LinkPeak",
    "ThrottleTime",
    "check_hardware",
    "counter_delta",
]

# The `link` label of `mfuscope_link_bytes_total`: NVLink and PCIe of the rank's GPU; the node's
# InfiniBand ports, RoCE ports (RDMA over an Ethernet link layer) and plain Ethernet interfaces.
HARDWARE_LINKS: tuple[str, ...] = ("nvlink", "pcie", "ib", "roce", "ethernet")
LINK_DIRECTIONS: tuple[str, ...] = ("tx", "rx")
MAX_LINK_ENTRIES = len(HARDWARE_LINKS) * len(LINK_DIRECTIONS)
MAX_THROTTLE_REASONS = 16

_Link = Annotated[str, choice(HARDWARE_LINKS)]
_LinkRate = Annotated[float, number(0.0, 1e15)]
_Ratio = Annotated[float, number(0.0, 1.0)]
# Any short snake_case name with a letter or digit: a newer agent may know a reason this
# collector does not.
_Reason = Annotated[str, Meta(pattern=r"^(?=_*[^\W_])\w{1,32}\Z")]


class LinkBytes(Struct, frozen=True, gc=False):
    """Bytes moved on one link kind in one direction since the sampler started."""

    link: _Link
    direction: Annotated[str, choice(LINK_DIRECTIONS)]
    bytes_total: Count


class LinkPeak(Struct, frozen=True, gc=False):
    """The spec unidirectional rate of the links the rank's counters cover, bytes/s."""

    link: _Link
    bytes_per_s: _LinkRate


class ThrottleTime(Struct, frozen=True, gc=False):
    """Seconds the SM clock was held down for `reason` since the sampler started."""

    reason: _Reason
    seconds_total: Annotated[float, number(0.0)]


class HardwareCounters(Struct, frozen=True, gc=False):
    """One rank's hardware counters; None / empty means the rank cannot read that counter.

    - `memory_busy_ratio`: fraction of the last sample period during which device memory (HBM)
      was being read or written (NVML utilisation ``memory``), 0..1;
    - `sm_clock_ratio`: current SM clock / maximum SM clock, 0..1;
    - `power_watts`: board power draw, W; `energy_joules_total`: energy used, J;
    - `links`, `link_peaks`, `throttle`: see their records.
    """

    memory_busy_ratio: _Ratio | None = None
    sm_clock_ratio: _Ratio | None = None
    power_watts: Annotated[float, number(0.0, 1e5)] | None = None
    energy_joules_total: Annotated[float, number(0.0)] | None = None
    links: Annotated[tuple[LinkBytes, ...], Meta(max_length=MAX_LINK_ENTRIES)] = ()
    link_peaks: Annotated[tuple[LinkPeak, ...], Meta(max_length=MAX_LINK_ENTRIES)] = ()
    throttle: Annotated[tuple[ThrottleTime, ...], Meta(max_length=MAX_THROTTLE_REASONS)] = ()


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


def check_hardware(hardware: HardwareCounters) -> None:
    """The rule of a decoded ``hardware`` record that no single field states: each entry once.
    Raises `SchemaError` naming the list."""
    for name, keys in (
        ("links", {(x.link, x.direction) for x in hardware.links}),
        ("link_peaks", {x.link for x in hardware.link_peaks}),
        ("throttle", {x.reason for x in hardware.throttle}),
    ):
        if len(keys) != len(getattr(hardware, name)):
            raise SchemaError(f"hardware.{name}", "the same entry appears twice")
