"""The bandwidth spec a process group's collectives can reach, with where it came from.

A spec is what nccl-tests' bus bandwidth (`mfuscope.core.bandwidth`) of the group's collectives is
compared with, so it must be a rate the fabric can reach (docs/definitions.md#link-specs):

- intra-node: the rank's own GPU link (NVLink links up x per-link rate, else its PCIe link), as
  NVML reports it, else the device's datasheet fabric.
- inter-node: the NIC bandwidth the group's ranks on one node drive. On a rail-optimised node each
  GPU has its own NIC, and NCCL spreads a collective's inter-node traffic over the NICs of all the
  group's local ranks, so busbw across nodes approaches the node's aggregate injection rate (a DGX
  with 4 x 100G EDR adapters reaches ~48 GB/s busbw, one adapter ~12 GB/s; 8 x A100 nodes with
  4 x HDR 200G measure 85-96 GB/s of a 100 GB/s aggregate: NVIDIA/nccl-tests issues 29, 119, 175,
  290). The spec is therefore

      aggregate = min(k, n) x per-NIC rate

  with k the group's ranks on this node and n the node's usable NIC ports (with ports of mixed
  rates: the sum of the k fastest). A group with one rank per node (dp across nodes beside tp
  inside them) drives one NIC; a group with 8 ranks on an 8-NIC node drives all 8.

Every spec carries its source (`LINK_SPEC_SOURCES`): ``user`` (agent options), ``nvml`` (detected
GPU links), ``sysfs`` (detected NIC ports), ``datasheet`` (the device table and, for NICs, the
vendor reference system: one NIC per GPU), or ``unknown``: no rate at all, and no efficiency is
computed against it. Nothing is guessed: a CPU (gloo) run, an unknown device, or a PCIe card in a
node whose NICs are not visible has an unknown spec on the tiers nothing describes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from mfuscope.core.hardware import default_link_tiers
from mfuscope.core.interconnects import DetectedLinks, detected_intra_node_link
from mfuscope.core.vocabulary import (
    LINK_SPEC_SOURCES,
    LINK_SPEC_UNKNOWN,
    TIER_INTER_NODE,
    TIER_INTRA_NODE,
)

__all__ = [
    "LinkSpec",
    "UserLinks",
    "group_link_spec",
    "inter_node_spec",
    "intra_node_spec",
    "node_nic_aggregate_bytes_per_s",
    "unknown_spec",
]


@dataclass(frozen=True)
class LinkSpec:
    """A unidirectional spec rate in bytes/s (None exactly when `source` is ``unknown``), its
    source (one of `LINK_SPEC_SOURCES`) and a one-line `detail` fit for a user."""

    bytes_per_s: float | None
    source: str
    detail: str

    def __post_init__(self) -> None:
        if self.source not in LINK_SPEC_SOURCES:
            raise ValueError(f"source must be one of {LINK_SPEC_SOURCES}, got {self.source!r}")
        if (self.bytes_per_s is None) != (self.source == LINK_SPEC_UNKNOWN):
            raise ValueError("bytes_per_s is None exactly when source is 'unknown'")
        if self.bytes_per_s is not None and not self.bytes_per_s > 0:
            raise ValueError(f"bytes_per_s must be > 0, got {self.bytes_per_s}")


@dataclass(frozen=True)
class UserLinks:
    """Link facts the user states (agent options); each overrides detection and datasheets.

    `intra_node_bytes_per_s`: the GPU's unidirectional intra-node link rate. `nic_bytes_per_s`:
    one NIC port's unidirectional rate; `nic_count`: the NIC ports a node has for training traffic
    (None: one per rank of the group on the node, the rail-optimised layout).
    """

    intra_node_bytes_per_s: float | None = None
    nic_bytes_per_s: float | None = None
    nic_count: int | None = None

    def __post_init__(self) -> None:
        for name in ("intra_node_bytes_per_s", "nic_bytes_per_s"):
            value = getattr(self, name)
            if value is not None and not value > 0:
                raise ValueError(f"{name} must be > 0 bytes/s, got {value}")
        if self.nic_count is not None and self.nic_count < 1:
            raise ValueError(f"nic_count must be >= 1, got {self.nic_count}")


def unknown_spec(detail: str) -> LinkSpec:
    """An explicit unknown: no rate, so no efficiency."""
    return LinkSpec(None, LINK_SPEC_UNKNOWN, detail)


def node_nic_aggregate_bytes_per_s(
    ranks_on_node: int, nic_rates_bits_per_s: Sequence[float]
) -> float | None:
    """Unidirectional bytes/s that `ranks_on_node` ranks drive through the node's NIC ports:
    the sum of the min(k, n) fastest port rates (bits/s, per direction) / 8; None without ports."""
    if ranks_on_node < 1:
        raise ValueError(f"ranks_on_node must be >= 1, got {ranks_on_node}")
    rates = sorted((r for r in nic_rates_bits_per_s if r > 0), reverse=True)
    if not rates:
        return None
    return sum(rates[:ranks_on_node]) / 8


def intra_node_spec(
    device: str | None, detected: DetectedLinks | None = None, user: UserLinks | None = None
) -> LinkSpec:
    """The rank's intra-node link: user > NVML (NVLink, else PCIe) > datasheet > unknown."""
    if user is not None and user.intra_node_bytes_per_s is not None:
        rate = user.intra_node_bytes_per_s
        return LinkSpec(rate, "user", f"user-supplied intra-node rate {rate / 1e9:g} GB/s")
    found = detected_intra_node_link(detected) if detected is not None else None
    if found is not None:
        return LinkSpec(found.unidirectional_bytes_per_s, "nvml", found.source)
    tier = default_link_tiers(device).get(TIER_INTRA_NODE)
    if tier is not None:
        return LinkSpec(tier.unidirectional_bytes_per_s, "datasheet", tier.source)
    what = "a CPU run" if device is None else f"device {device!r}"
    return unknown_spec(f"no intra-node link spec for {what} (pass intra_node_link_bytes_per_s)")


def inter_node_spec(
    device: str | None,
    ranks_on_node: int,
    detected: DetectedLinks | None = None,
    user: UserLinks | None = None,
) -> LinkSpec:
    """The node's aggregate NIC rate that `ranks_on_node` ranks of a group drive:
    min(k, NICs) x per-NIC rate, from user > sysfs > the datasheet reference system > unknown."""
    k = ranks_on_node
    if user is not None and user.nic_bytes_per_s is not None:
        nics = user.nic_count if user.nic_count is not None else k
        used = min(k, nics)
        rate = used * user.nic_bytes_per_s
        return LinkSpec(
            rate,
            "user",
            f"{used} of {nics} user-stated NICs x {user.nic_bytes_per_s / 1e9:g} GB/s "
            f"({k} ranks of the group on the node)",
        )
    stated_count = user.nic_count if user is not None else None
    ports = [r for r in (detected.nic_rates_bits_per_s if detected else ()) if r > 0]
    if ports:
        used = min(k, len(ports) if stated_count is None else stated_count)
        aggregate = node_nic_aggregate_bytes_per_s(used, ports)
        assert aggregate is not None  # ports is not empty
        kind = (detected.nic_kind if detected else None) or "ethernet"
        return LinkSpec(
            aggregate,
            "sysfs",
            f"{min(used, len(ports))} of {len(ports)} active {kind} ports, "
            f"{aggregate * 8 / 1e9:g} Gb/s ({k} ranks of the group on the node)",
        )
    tier = default_link_tiers(device).get(TIER_INTER_NODE)
    if tier is not None:
        used = min(k, k if stated_count is None else stated_count)
        return LinkSpec(
            used * tier.unidirectional_bytes_per_s,
            "datasheet",
            f"{used} x {tier.source} (reference system: one NIC per GPU; "
            f"{k} ranks of the group on the node)",
        )
    what = "a CPU run" if device is None else f"device {device!r}"
    return unknown_spec(
        f"no NIC found and no datasheet NIC for {what} (pass nic_bytes_per_s / nic_count)"
    )


def group_link_spec(
    tier: str,
    device: str | None,
    *,
    ranks_on_node: int,
    detected: DetectedLinks | None = None,
    user: UserLinks | None = None,
) -> LinkSpec:
    """The spec of a group on `tier` with `ranks_on_node` of its ranks on this rank's node."""
    if tier == TIER_INTRA_NODE:
        return intra_node_spec(device, detected, user)
    if tier == TIER_INTER_NODE:
        return inter_node_spec(device, ranks_on_node, detected, user)
    return unknown_spec(f"tier {tier!r}: the group's placement is unknown")
