"""Collective bandwidth exactly as nccl-tests defines it, and the alpha-beta transfer model.

Source: NVIDIA nccl-tests, doc/PERFORMANCE.md ("algbw" and "busbw"); definitions in
docs/definitions.md#bus-bandwidth and docs/definitions.md#alpha-beta-model.

- ``algbw = S / t`` where S is the full array size in bytes as nccl-tests counts it (for
  all_gather / reduce_scatter the *gathered* size, for all_reduce the buffer size).
- ``busbw = algbw * factor``; the factor turns algbw into the per-link rate a ring achieves, so it
  can be compared with a link's unidirectional peak regardless of group size n:
  all_reduce ``2(n-1)/n`` (a reduce-scatter then an all-gather, each moving (n-1)/n of S per rank);
  all_gather, reduce_scatter, all_to_all ``(n-1)/n``; broadcast, reduce, send, recv ``1``.
- Over many calls (ranks, ops, sizes, time) busbw is aggregated one way: the summed bus bytes
  over the summed seconds of the calls whose size and group size are known
  (`aggregate_busbw_bytes_per_s`, docs/definitions.md#aggregating-busbw), what the recording
  rules compute from the collector's counters (`mfuscope.core.promql.quantities.busbw`).
- ``efficiency = busbw / spec`` of the group's tier (`busbw_efficiency`).
"""

from __future__ import annotations

import msgspec
from mfuscope.core.vocabulary import COLLECTIVE_OPS

__all__ = [
    "LinkModel",
    "aggregate_busbw_bytes_per_s",
    "algbw_bytes_per_s",
    "bus_factor",
    "busbw_bytes_per_s",
    "busbw_efficiency",
    "ideal_transfer_s",
]


def bus_factor(op: str, group_size: int) -> float:
    """The nccl-tests factor from algbw to busbw for `op` over `group_size` ranks."""
    if op not in COLLECTIVE_OPS:
        raise ValueError(f"unknown collective op {op!r}; expected one of {COLLECTIVE_OPS}")
    if group_size < 1:
        raise ValueError(f"group_size must be >= 1, got {group_size}")
    n = group_size
    if op == "all_reduce":
        return 2.0 * (n - 1) / n
    if op in ("all_gather", "reduce_scatter", "all_to_all"):
        return (n - 1) / n
    return 1.0


def algbw_bytes_per_s(size_bytes: float, seconds: float) -> float:
    """``algbw = S / t`` in bytes/s; `seconds` must be positive."""
    if seconds <= 0:
        raise ValueError(f"seconds must be > 0, got {seconds}")
    return size_bytes / seconds


def busbw_bytes_per_s(op: str, group_size: int, size_bytes: float, seconds: float) -> float:
    """``busbw = algbw * bus_factor(op, n)`` in bytes/s."""
    return algbw_bytes_per_s(size_bytes, seconds) * bus_factor(op, group_size)


def aggregate_busbw_bytes_per_s(bus_bytes: float, seconds: float) -> float | None:
    """busbw of a set of calls, bytes/s: ``Σ S_i * factor_i / Σ t_i`` over the calls whose size
    and group size are known (`bus_bytes` their summed bus bytes, `seconds` their summed
    durations), whichever ranks, ops, sizes and times they span. That is the time-weighted mean of
    the calls' busbw, and a ratio of sums, so it adds up exactly across ranks and collectors;
    calls of unknown size are left out of both sums, or they would pull busbw down. None when no
    such call took any time."""
    if not seconds > 0:
        return None
    return bus_bytes / seconds


def busbw_efficiency(busbw: float | None, spec_bytes_per_s: float | None) -> float | None:
    """``busbw / spec``: the share of the tier's unidirectional link rate the calls reached
    (docs/definitions.md#bandwidth-efficiency). None when either is unknown (a spec of 0 is
    unknown: no rate is invented)."""
    if busbw is None or spec_bytes_per_s is None or not spec_bytes_per_s > 0:
        return None
    return busbw / spec_bytes_per_s


class LinkModel(msgspec.Struct, frozen=True):
    """Alpha-beta (Hockney) model of one link tier: ``t(bytes) = alpha_s + bytes / beta``.

    `beta_bytes_per_s` is the unidirectional rate, the figure nccl-tests busbw compares against.
    """

    alpha_s: float
    beta_bytes_per_s: float

    def __post_init__(self) -> None:
        if not self.alpha_s >= 0:
            raise ValueError(f"alpha_s must be >= 0, got {self.alpha_s}")
        if not self.beta_bytes_per_s > 0:
            raise ValueError(f"beta_bytes_per_s must be > 0, got {self.beta_bytes_per_s}")


def ideal_transfer_s(link: LinkModel, size_bytes: float) -> float:
    """Time the alpha-beta model allows for moving `size_bytes` over `link`, in seconds."""
    return link.alpha_s + size_bytes / link.beta_bytes_per_s
