"""Hardware counters of one rank: the wire records and the counter arithmetic, torch-free.

The agent's sampler (`mfuscope.agent.hwcounters`) reads the device and NIC counters about once a
second and ships a `HardwareCounters` record with every batch; the collector turns the records
into the ``mfuscope_device_*`` and ``mfuscope_link_bytes_total`` series (docs/metrics.md in the
README's metric contract). Units are base units: bytes, seconds, watts, joules, ratios 0..1.

Totals are cumulative since the rank's sampler started (so a restarted agent starts again from
zero, which the collector detects, as for the agent-health counters). A counter the rank cannot
read is left out of the record, never sent as zero: "no NVLink counters" and "no NVLink traffic"
are different facts.
"""

from __future__ import annotations

from dataclasses import dataclass

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
