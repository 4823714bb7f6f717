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
from typing import Any, Protocol, TypeVar

__all__ = [
    "VISIBLE_DEVICES_ENV",
    "GpuRef",
    "cuda_gpu_ref",
    "current_gpu_ref",
    "gpu_ref_from_properties",
    "match_gpu",
    "normalise_bus_id",
    "nvml_handle",
    "runs_in_mig_mode",
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
    @property
    def mig_enabled(self) -> bool: ...
    @property
    def mig_uuids(self) -> tuple[str, ...]: ...


_G = TypeVar("_G", bound=_GpuFacts)


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


def cuda_gpu_ref(cuda_index: int, environ: Mapping[str, str] | None = None) -> GpuRef:
    """The `GpuRef` of CUDA device `cuda_index`: with its UUID and bus id when torch can say,
    else the bare index (which the lookups use only while ``CUDA_VISIBLE_DEVICES`` is unset)."""
    env = os.environ if environ is None else environ
    found = current_gpu_ref(cuda_index)
    return found or GpuRef(cuda_index=cuda_index, visible_devices=env.get(VISIBLE_DEVICES_ENV))


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


def _identity_keys(ref: GpuRef) -> list[tuple[str, str]]:
    """The join of a CUDA device to an NVML device, in order: its UUID (and, for a MIG slice
    whose bare UUID was read as ``GPU-``, the ``MIG-`` form), then its PCI bus id. The one rule
    behind `nvml_handle` and `match_gpu`; after it, the CUDA index only while it is physical."""
    keys: list[tuple[str, str]] = []
    if ref.uuid:
        keys.append(("uuid", ref.uuid))
        if ref.uuid.startswith("GPU-"):
            keys.append(("uuid", "MIG-" + ref.uuid[4:]))
    bus = normalise_bus_id(ref.pci_bus_id)
    if bus is not None:
        keys.append(("pci_bus_id", bus))
    return keys


# nvidia-ml-py's Python names; the bus-id lookup calls NVML's nvmlDeviceGetHandleByPciBusId_v2.
_NVML_LOOKUP = {"uuid": "nvmlDeviceGetHandleByUUID", "pci_bus_id": "nvmlDeviceGetHandleByPciBusId"}


def nvml_handle(nvml: Any, ref: GpuRef) -> tuple[Any, str]:
    """The NVML handle of `ref`'s GPU and how it was found (``uuid``, ``pci_bus_id``, or
    ``index`` when the CUDA index had to stand in). Raises LookupError, saying why, when none
    is safe: the CUDA index is never used while ``CUDA_VISIBLE_DEVICES`` is set."""
    failures: list[str] = []
    for how, key in _identity_keys(ref):
        fn_name = _NVML_LOOKUP[how]
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


def _has_key(gpu: _GpuFacts, how: str, key: str) -> bool:
    if how == "uuid":  # the GPU's own UUID, or one of its MIG slices' (the slice runs on it)
        return gpu.uuid == key or key in gpu.mig_uuids
    return normalise_bus_id(gpu.pci_bus_id) == key


def match_gpu(gpus: Sequence[_G], ref: GpuRef | None) -> _G | None:
    """The detected (NVML) GPU that is `ref`'s, by the keys of `nvml_handle` in the same order:
    same UUID (a MIG slice's matches the GPU it is carved from), else same PCI bus id, else
    (only with ``CUDA_VISIBLE_DEVICES`` unset) the same index; None when no match is safe."""
    if ref is None:
        return None
    for how, key in _identity_keys(ref):
        found = next((g for g in gpus if _has_key(g, how, key)), None)
        if found is not None:
            return found
    if ref.index_is_physical:
        return next((g for g in gpus if g.index == ref.cuda_index), None)
    return None


def runs_in_mig_mode(gpus: Sequence[_GpuFacts], ref: GpuRef | None) -> bool:
    """Whether the rank's GPU (`match_gpu`) has MIG mode on, so its peak is a slice's. A GPU
    that cannot be matched while some GPU of the node has MIG on counts as MIG too: its peak is
    then unknown unless its name carries the slice's profile, never a whole GPU's that may be
    another GPU's. No GPU (`ref` None): False."""
    if ref is None:
        return False
    found = match_gpu(gpus, ref)
    if found is not None:
        return bool(found.mig_enabled)
    return any(g.mig_enabled for g in gpus)
