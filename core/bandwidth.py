"""Collective bandwidth exactly as nccl-tests defines it, and the alpha-beta transfer model.

Source: NVIDIA nccl-tests, doc/PERFORMANCE.md ("algbw" and "busbw"); definitions in
docs/definitions.md#bus-bandwidth and docs/definitions.md#alpha-beta-model.

- ``algbw = S / t`` where S is the full array size in bytes as nccl-tests counts it (for
  all_gather / reduce_scatter the *gathered* size, for all_reduce the buffer size).
- ``busbw = algbw * factor``; the factor turns algbw into the per-link rate a ring achieves, so it
  can be compared with a link's unidirectional peak regardless of group size n:
  all_reduce ``2(n-1)/n`` (a reduce-scatter then an all-gather, each moving (n-1)/n of S per rank);
  all_gather, reduce_scatter, all_to_all ``(n-1)/n``; broadcast, reduce, send, recv ``1``.
"""

from __future__ import annotations

import msgspec
from mfuscope.core.vocabulary import COLLECTIVE_OPS

__all__ = [
    "LinkModel",
    "algbw_bytes_per_s",
    "bus_factor",
    "busbw_bytes_per_s",
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
