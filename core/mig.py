"""MIG (Multi-Instance GPU) slices: the share of the whole GPU's peaks a slice owns.

A MIG device is named after its profile, ``<c>g.<m>gb``: `c` compute slices of the 7 an A100,
H100, H200 or B200 splits into, and `m` GB of the GPU's memory. NVML and CUDA report a slice's
name as the parent's name plus the profile ("NVIDIA A100-SXM4-40GB MIG 1g.5gb", "NVIDIA H100
80GB HBM3 MIG 3g.40gb"; NVIDIA MIG user guide, "Supported MIG profiles").

- Peak FLOP/s: the whole GPU's x c / 7. (A slice's SMs: 7g on an A100 has 98 of 108 SMs, 1g 14;
  c / 7 of the datasheet peak is the share of the GPU the slice was sold as.)
- Memory bandwidth: memory slices are eighths of the GPU's memory and its controllers, so the
  share is m over the parent's memory, rounded to the nearest eighth (1g.10gb of 80 GB = 1/8,
  3g.40gb = 4/8, 7g.80gb = 8/8). Unknown when the parent's memory size is not in the name.

A name that says MIG but carries no readable profile gives no share: the peak is then unknown,
never the whole GPU's.
"""

from __future__ import annotations

import re

import msgspec

__all__ = ["MIG_COMPUTE_SLICES", "MigSlice", "is_mig_name", "mig_slice"]

MIG_COMPUTE_SLICES = 7
_MEMORY_SLICES = 8
_PROFILE = re.compile(r"\bmig\s+(\d+)g\.(\d+)gb\b", re.IGNORECASE)
_MIG_WORD = re.compile(r"\bmig\b", re.IGNORECASE)
_PARENT_MEMORY = re.compile(r"(\d+)\s*gb\b", re.IGNORECASE)


class MigSlice(msgspec.Struct, frozen=True):
    """A MIG profile: `compute_slices` of 7, `memory_gb` of the parent's `parent_memory_gb`."""

    compute_slices: int
    memory_gb: int
    parent_memory_gb: int | None

    @property
    def profile(self) -> str:
        return f"{self.compute_slices}g.{self.memory_gb}gb"

    @property
    def compute_share(self) -> float:
        """The slice's share of the whole GPU's peak FLOP/s, 0..1."""
        return self.compute_slices / MIG_COMPUTE_SLICES

    @property
    def memory_share(self) -> float | None:
        """The slice's share of the whole GPU's memory bandwidth, 0..1 (eighths); None when the
        parent's memory size is unknown."""
        if not self.parent_memory_gb:
            return None
        exact = self.memory_gb / self.parent_memory_gb * _MEMORY_SLICES
        if not 0.75 <= exact <= _MEMORY_SLICES + 0.5:
            # Not a fraction of this size: the number in the name is not the GPU's memory
            # (a GH200's "480GB" is its CPU memory).
            return None
        return min(max(round(exact), 1), _MEMORY_SLICES) / _MEMORY_SLICES


def is_mig_name(name: str) -> bool:
    """Whether a device name is a MIG slice's (it has the word ``MIG``)."""
    return _MIG_WORD.search(name) is not None


def mig_slice(name: str) -> MigSlice | None:
    """The MIG profile in a device name, or None when the name has none (or an impossible one:
    more than 7 compute slices)."""
    match = _PROFILE.search(name)
    if match is None:
        return None
    compute, memory = int(match.group(1)), int(match.group(2))
    if not 1 <= compute <= MIG_COMPUTE_SLICES or memory < 1:
        return None
    parent_part = name[: match.start()]
    parents = [int(m) for m in _PARENT_MEMORY.findall(parent_part)]
    return MigSlice(compute, memory, parents[-1] if parents else None)
