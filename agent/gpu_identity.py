"""Which physical GPU a rank drives, and its NVML handle (docs/agent.md#gpu-identity).

CUDA numbers the devices a process sees (``CUDA_VISIBLE_DEVICES`` picks and orders them); NVML
numbers every GPU of the node in PCI order. The two indices agree only when
``CUDA_VISIBLE_DEVICES`` is unset (and CUDA's default fastest-first order matches PCI order, as on
nodes of one GPU model): with ``CUDA_VISIBLE_DEVICES=3,1`` CUDA device 0 is NVML device 3. So the
agent finds the rank's NVML device by the CUDA device's UUID, else its PCI bus id (both from
``torch.cuda.get_device_properties``: ``uuid``, ``pci_domain_id`` / ``pci_bus_id`` /
``pci_device_id``), and by the CUDA index only when ``CUDA_VISIBLE_DEVICES`` is unset and neither
finds it (an older torch without the PCI ids, an NVML binding without the lookups); with
``CUDA_VISIBLE_DEVICES`` set and no match the GPU's NVML facts and counters stay unknown.

The NVML calls are pynvml's (``nvidia-ml-py`` 13): ``nvmlDeviceGetHandleByUUID``,
``nvmlDeviceGetHandleByPciBusId`` (NVML's ``_v2`` entry point), ``nvmlDeviceGetHandleByIndex``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

__all__ = [
    "VISIBLE_DEVICES_ENV",
    "GpuRef",
    "current_gpu_ref",
    "gpu_ref_from_properties",
    "match_gpu",
    "normalise_bus_id",
    "nvml_handle",
]

VISIBLE_DEVICES_ENV = "CUDA_VISIBLE_DEVICES"


@dataclass(frozen=True)
class GpuRef:
    """A rank's GPU as CUDA describes it. `uuid` in NVML's form (``GPU-...`` / ``MIG-...``),
    `pci_bus_id` in NVML's form (``00000000:3B:00.0``); `visible_devices` is
    ``CUDA_VISIBLE_DEVICES`` as set (None when unset: the CUDA index is the NVML index)."""

    cuda_index: int
    uuid: str | None = None
    pci_bus_id: str | None = None
    visible_devices: str | None = None

    @property
    def index_is_physical(self) -> bool:
        return self.visible_devices is None


class _GpuFacts(Protocol):
    """What `match_gpu` reads of a detected GPU (`mfuscope.agent.detect.GpuInfo`)."""

    @property
    def index(self) -> int: ...
    @property
    def uuid(self) -> str | None: ...
    @property
    def pci_bus_id(self) -> str | None: ...


def normalise_bus_id(text: str | None) -> str | None:
    """``domain:bus:device.function`` with an 8-digit upper-case domain (NVML's ``busId``), from
    either NVML form (``0000:3b:00.0`` legacy or ``00000000:3B:00.0``); None if malformed."""
    if not text:
        return None
    parts = text.strip().split(":")
    if len(parts) != 3 or "." not in parts[2]:
        return None
    device, _, function = parts[2].partition(".")
    try:
        domain, bus, dev, fn = (int(p, 16) for p in (parts[0], parts[1], device, function))
    except ValueError:
        return None
    return f"{domain:08X}:{bus:02X}:{dev:02X}.{fn:X}"


def gpu_ref_from_properties(
    cuda_index: int, properties: Any, environ: Mapping[str, str] | None = None
) -> GpuRef:
    """The `GpuRef` of CUDA device `cuda_index` from its ``torch.cuda.get_device_properties``
    (attributes read defensively: an older torch lacks the PCI ids)."""
    env = os.environ if environ is None else environ
    raw_uuid = getattr(properties, "uuid", None)
    uuid = str(raw_uuid).strip() if raw_uuid is not None else ""
    if uuid and not uuid.startswith(("GPU-", "MIG-")):
        uuid = f"GPU-{uuid}"  # torch prints the bare 8-4-4-4-12 form
    ids = [getattr(properties, f"pci_{k}_id", None) for k in ("domain", "bus", "device")]
    bus_id = None
    if all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in ids):
        domain, bus, device = ids
        bus_id = f"{domain:08X}:{bus:02X}:{device:02X}.0"  # CUDA devices are function 0
    return GpuRef(
        cuda_index=cuda_index,
        uuid=uuid or None,
        pci_bus_id=bus_id,
        visible_devices=env.get(VISIBLE_DEVICES_ENV),
    )


def current_gpu_ref(cuda_index: int | None = None) -> GpuRef | None:
    """The `GpuRef` of `cuda_index` (default: the current CUDA device); None when CUDA has not
    been initialised by the job (the agent never initialises CUDA itself) or cannot say."""
    try:
        import torch

        if not torch.cuda.is_available() or not torch.cuda.is_initialized():
            return None
        index = torch.cuda.current_device() if cuda_index is None else cuda_index
        return gpu_ref_from_properties(index, torch.cuda.get_device_properties(index))
    except Exception:  # telemetry never stops the job
        return None


def nvml_handle(nvml: Any, ref: GpuRef) -> tuple[Any, str]:
    """The NVML handle of `ref`'s GPU and how it was found (``uuid``, ``pci_bus_id``, or
    ``index`` when the CUDA index had to stand in). Raises LookupError, saying why, when none
    is safe: the CUDA index is never used while ``CUDA_VISIBLE_DEVICES`` is set."""
    failures: list[str] = []
    candidates: list[tuple[str, str, str]] = []
    if ref.uuid:
        candidates.append(("uuid", "nvmlDeviceGetHandleByUUID", ref.uuid))
        if ref.uuid.startswith("GPU-"):  # a MIG slice's bare uuid reads as GPU- above
            candidates.append(("uuid", "nvmlDeviceGetHandleByUUID", "MIG-" + ref.uuid[4:]))
    if ref.pci_bus_id:
        # nvidia-ml-py's Python name; it calls NVML's nvmlDeviceGetHandleByPciBusId_v2.
        candidates.append(("pci_bus_id", "nvmlDeviceGetHandleByPciBusId", ref.pci_bus_id))
    for how, fn_name, key in candidates:
        fn = getattr(nvml, fn_name, None)
        if fn is None:
            continue
        try:
            return fn(key), how
        except Exception as exc:  # NVMLError_NotFound, an old driver, ...
            failures.append(f"{fn_name}({key!r}): {type(exc).__name__}")
    if ref.index_is_physical:
        return nvml.nvmlDeviceGetHandleByIndex(ref.cuda_index), "index"
    tried = "; ".join(failures) or "no UUID or PCI bus id from CUDA"
    raise LookupError(
        f"the NVML device of CUDA device {ref.cuda_index} is unknown ({tried}) and "
        f"{VISIBLE_DEVICES_ENV}={ref.visible_devices!r} makes the CUDA index unsafe"
    )


def match_gpu(gpus: Sequence[_GpuFacts], ref: GpuRef | None) -> _GpuFacts | None:
    """The detected GPU that is `ref`'s: same UUID, else same PCI bus id, else (only with
    ``CUDA_VISIBLE_DEVICES`` unset) the same index; None when no match is safe."""
    if ref is None:
        return None
    if ref.uuid:
        found = next((g for g in gpus if g.uuid and g.uuid == ref.uuid), None)
        if found is not None:
            return found
    bus = normalise_bus_id(ref.pci_bus_id)
    if bus is not None:
        found = next((g for g in gpus if normalise_bus_id(g.pci_bus_id) == bus), None)
        if found is not None:
            return found
    if ref.index_is_physical:
        return next((g for g in gpus if g.index == ref.cuda_index), None)
    return None
