"""Hardware detection on the training node: GPUs and their links via NVML, NICs via sysfs, hostname.

Everything degrades: no NVML library, no GPU, a permission error or a function the driver does not
support each end in "unknown" for that item plus a line in `HardwareInfo.reasons`, never in an
exception. The boundaries are injected so tests run without a GPU or an InfiniBand card:

- `nvml`: an object with pynvml's function names (the `pynvml` module from ``nvidia-ml-py`` by
  default). Without a GPU, ``pynvml.nvmlInit()`` raises ``NVMLError_LibraryNotFound``.
- `sysfs_root`: the directory that plays ``/`` for ``sys/class/infiniband/*/ports/*/{rate,state,
  link_layer}``.
- `hostname_fn`: returns the host name (``socket.gethostname`` by default).

NVML details this relies on:

- ``nvmlDeviceGetNvLinkVersion`` returns an enum, not the generation: 1 = 1.0, 2 = 2.0, 3 = 2.2,
  4 = 3.0, 5 = 3.1, 6 = 4.0, 7 = 5.0 (an A100 reports 5; hwloc issue #658, NVML API docs
  ``nvmlNvlinkVersion_t``). `NVLINK_ENUM_TO_GENERATION` maps it to the generation.
- PCIe generation and width come from ``nvmlDeviceGetMaxPcieLinkGeneration/Width`` (the link the
  slot and GPU negotiate at full speed); the *current* values drop at idle to save power.
- The pairwise topology follows ``nvidia-smi topo -m``: ``NV<k>`` when P2P over NVLink is possible
  (k = links up on the lower GPU), else the common PCIe ancestor (PIX, PXB, PHB, NODE, SYS).
"""

from __future__ import annotations

import os
import socket
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mfuscope.agent._hw_readers import is_physical_netdev, list_dir, read_text_or_none
from mfuscope.agent.gpu_identity import normalise_bus_id
from mfuscope.core.hwcounters import LinkPeak
from mfuscope.core.interconnects import (
    NVLINK_PER_LINK_BYTES_PER_S,
    PCIE_PER_LANE_BYTES_PER_S,
    DetectedLinks,
)

__all__ = [
    "NVLINK_ENUM_TO_GENERATION",
    "GpuInfo",
    "HardwareInfo",
    "NicPort",
    "detect_hardware",
    "link_peaks",
    "parse_ib_rate_bits_per_s",
]

NVLINK_ENUM_TO_GENERATION: dict[int, int] = {1: 1, 2: 2, 3: 2, 4: 3, 5: 3, 6: 4, 7: 5, 8: 6}
_NVLINK_MAX_LINKS = 18  # the most any GPU has (H100, B200); NVML's constant is a loose bound (36)
_TOPOLOGY_LEVELS = {0: "X", 10: "PIX", 20: "PXB", 30: "PHB", 40: "NODE", 50: "SYS"}
_NVLINK_P2P_INDEX = 2  # NVML_P2P_CAPS_INDEX_NVLINK
_P2P_OK = 0  # NVML_P2P_STATUS_OK
_FEATURE_ENABLED = 1  # NVML_FEATURE_ENABLED
_MIG_ENABLED = 1  # NVML_DEVICE_MIG_ENABLE


@dataclass(frozen=True)
class GpuInfo:
    """One local GPU as NVML reports it; None means unknown (see `HardwareInfo.reasons`)."""

    index: int
    name: str | None
    nvlink_generation: int | None = None
    nvlink_links_up: int = 0
    pcie_generation: int | None = None
    pcie_width: int | None = None
    # Identity, to match the CUDA device a rank uses (`gpu_identity.match_gpu`).
    uuid: str | None = None  # "GPU-..."
    pci_bus_id: str | None = None  # "00000000:3B:00.0"
    # NVML MIG mode (``nvmlDeviceGetMigMode``, current mode enabled): the rank then runs on a
    # slice, whose peak is a share of this GPU's (`mfuscope.core.mig`). The slices' UUIDs
    # (``MIG-...``) let a rank on a slice find this GPU by the UUID CUDA gives it.
    mig_enabled: bool = False
    mig_uuids: tuple[str, ...] = ()


@dataclass(frozen=True)
class NicPort:
    """One NIC port; `rate_bits_per_s` is per direction. RDMA ports come from
    ``/sys/class/infiniband``; without any, plain Ethernet interfaces from ``/sys/class/net``
    (`rdma` False)."""

    device: str
    port: str
    rate_bits_per_s: float | None
    link_layer: str | None  # "InfiniBand" or "Ethernet" (RoCE)
    active: bool
    rdma: bool = True

    @property
    def kind(self) -> str:
        if not self.rdma:
            return "ethernet"
        return "roce" if (self.link_layer or "").lower() == "ethernet" else "infiniband"


@dataclass(frozen=True)
class HardwareInfo:
    """What this node has; `topology[i][j]` relates local GPUs i and j (``nvidia-smi topo -m``)."""

    hostname: str | None
    gpus: tuple[GpuInfo, ...] = ()
    topology: tuple[tuple[str, ...], ...] = ()
    nics: tuple[NicPort, ...] = ()
    reasons: tuple[str, ...] = field(default=())

    @property
    def device_name(self) -> str | None:
        """The first GPU's name (dtype-agnostic: look the peak up with `hardware.lookup_peak`)."""
        return self.gpus[0].name if self.gpus else None

    def links_for(self, nvml_index: int = 0) -> DetectedLinks:
        """The links of the GPU NVML numbers `nvml_index` (find a rank's with
        `gpu_identity.match_gpu`, never from its CUDA index), as plain data for
        `hardware.link_for_tier`."""
        gpu = next((g for g in self.gpus if g.index == nvml_index), None)
        active = [p for p in self.nics if p.active and p.rate_bits_per_s]
        kinds = {p.kind for p in active}
        return DetectedLinks(
            nvlink_generation=gpu.nvlink_generation if gpu else None,
            nvlink_links_up=gpu.nvlink_links_up if gpu else 0,
            pcie_generation=gpu.pcie_generation if gpu else None,
            pcie_width=gpu.pcie_width if gpu else None,
            nic_rates_bits_per_s=tuple(float(p.rate_bits_per_s or 0) for p in active),
            nic_kind=kinds.pop() if len(kinds) == 1 else ("infiniband" if kinds else None),
        )


def parse_ib_rate_bits_per_s(text: str) -> float | None:
    """Parse a sysfs ``rate`` file (``"400 Gb/sec (4X NDR)"``) into bits/s; None if unreadable."""
    parts = text.strip().split()
    if len(parts) < 2 or not parts[1].lower().startswith("gb/s"):
        return None
    try:
        value = float(parts[0])
    except ValueError:
        return None
    return value * 1e9 if value > 0 else None


def _describe(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _text(value: Any) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


class _Nvml:
    """The NVML calls we make, each turning a failure into None plus a recorded reason."""

    def __init__(self, nvml: Any, reasons: list[str]) -> None:
        self.nvml = nvml
        self.reasons = reasons

    def call(self, what: str, fn_name: str, *args: Any) -> Any:
        try:
            return getattr(self.nvml, fn_name)(*args)
        except Exception as exc:  # NVMLError, AttributeError on an old binding, ...
            self.reasons.append(f"{what}: {_describe(exc)}")
            return None

    def quiet(self, fn_name: str, *args: Any) -> Any:
        """A call whose failure is expected (e.g. an NVLink index the GPU does not have)."""
        try:
            return getattr(self.nvml, fn_name)(*args)
        except Exception:
            return None


def _nvlink(api: _Nvml, handle: Any, index: int) -> tuple[int | None, int]:
    up = 0
    versions: set[int] = set()
    for link in range(_NVLINK_MAX_LINKS):
        if api.quiet("nvmlDeviceGetNvLinkState", handle, link) != _FEATURE_ENABLED:
            continue
        up += 1
        version = api.quiet("nvmlDeviceGetNvLinkVersion", handle, link)
        if isinstance(version, int) and version in NVLINK_ENUM_TO_GENERATION:
            versions.add(NVLINK_ENUM_TO_GENERATION[version])
    if up and not versions:
        api.reasons.append(f"GPU {index}: {up} NVLink links up but their version is unknown")
    return (max(versions) if versions else None), up


def _gpu(api: _Nvml, index: int, handle: Any) -> GpuInfo:
    name = api.call(f"GPU {index} name", "nvmlDeviceGetName", handle)
    generation, links_up = _nvlink(api, handle, index)
    gen = api.call(f"GPU {index} PCIe generation", "nvmlDeviceGetMaxPcieLinkGeneration", handle)
    width = api.call(f"GPU {index} PCIe width", "nvmlDeviceGetMaxPcieLinkWidth", handle)
    # Quiet: without them the rank's GPU is matched by index where that is safe, and the agent
    # logs a GPU it cannot match (docs/agent.md#gpu-identity).
    uuid = api.quiet("nvmlDeviceGetUUID", handle)
    pci = api.quiet("nvmlDeviceGetPciInfo", handle)
    bus_id = getattr(pci, "busId", None)
    mig = api.quiet("nvmlDeviceGetMigMode", handle)  # [current, pending]; absent without MIG
    mig_enabled = isinstance(mig, (list, tuple)) and bool(mig) and mig[0] == _MIG_ENABLED
    return GpuInfo(
        index=index,
        name=_text(name) if name is not None else None,
        nvlink_generation=generation,
        nvlink_links_up=links_up,
        pcie_generation=gen if isinstance(gen, int) and gen > 0 else None,
        pcie_width=width if isinstance(width, int) and width > 0 else None,
        uuid=_text(uuid) if uuid else None,
        pci_bus_id=normalise_bus_id(_text(bus_id)) if bus_id else None,
        mig_enabled=mig_enabled,
        mig_uuids=_mig_uuids(api, handle) if mig_enabled else (),
    )


def _mig_uuids(api: _Nvml, handle: Any) -> tuple[str, ...]:
    """The UUIDs of the MIG slices carved from the GPU (``nvmlDeviceGetMaxMigDeviceCount``
    slots; an empty slot raises NotFound and is skipped)."""
    slots = api.quiet("nvmlDeviceGetMaxMigDeviceCount", handle)
    uuids = []
    for slot in range(slots if isinstance(slots, int) else 0):
        mig_handle = api.quiet("nvmlDeviceGetMigDeviceHandleByIndex", handle, slot)
        uuid = None if mig_handle is None else api.quiet("nvmlDeviceGetUUID", mig_handle)
        if uuid:
            uuids.append(_text(uuid))
    return tuple(uuids)


def _pair(api: _Nvml, gpus: list[GpuInfo], handles: list[Any], i: int, j: int) -> str:
    if i == j:
        return "X"
    status = api.quiet("nvmlDeviceGetP2PStatus", handles[i], handles[j], _NVLINK_P2P_INDEX)
    if status == _P2P_OK:
        links = min(gpus[i].nvlink_links_up, gpus[j].nvlink_links_up)
        return f"NV{links}"
    level = api.quiet("nvmlDeviceGetTopologyCommonAncestor", handles[i], handles[j])
    return _TOPOLOGY_LEVELS.get(level, "?") if isinstance(level, int) else "?"


def _detect_gpus(nvml: Any, reasons: list[str]) -> tuple[list[GpuInfo], list[list[str]]]:
    if nvml is None:
        try:
            import pynvml
        except ImportError as exc:
            reasons.append(f"NVML unavailable: nvidia-ml-py is not installed ({_describe(exc)})")
            return [], []
        nvml = pynvml
    api = _Nvml(nvml, reasons)
    try:
        nvml.nvmlInit()
    except Exception as exc:
        reasons.append(f"NVML unavailable (no NVIDIA driver or GPU?): {_describe(exc)}")
        return [], []
    try:
        count = api.call("GPU count", "nvmlDeviceGetCount")
        if not isinstance(count, int) or count <= 0:
            if count == 0:
                reasons.append("NVML found no GPU")
            return [], []
        handles = [
            api.call(f"GPU {i} handle", "nvmlDeviceGetHandleByIndex", i) for i in range(count)
        ]
        gpus = [GpuInfo(i, None) if h is None else _gpu(api, i, h) for i, h in enumerate(handles)]
        if any(h is None for h in handles):
            return gpus, []
        matrix = [[_pair(api, gpus, handles, i, j) for j in range(count)] for i in range(count)]
        return gpus, matrix
    finally:
        api.quiet("nvmlShutdown")


def _detect_nics(sysfs_root: Path, reasons: list[str]) -> list[NicPort]:
    base = sysfs_root / "sys" / "class" / "infiniband"
    try:
        devices = sorted(p for p in base.iterdir())
    except OSError as exc:
        reasons.append(f"no RDMA NICs found under {base}: {_describe(exc)}")
        return []
    ports: list[NicPort] = []
    for device in devices:
        try:
            port_dirs = sorted((device / "ports").iterdir())
        except OSError as exc:
            reasons.append(f"{device.name}: cannot list ports: {_describe(exc)}")
            continue
        for port in port_dirs:
            rate_text = read_text_or_none(port / "rate")
            rate = parse_ib_rate_bits_per_s(rate_text) if rate_text is not None else None
            if rate is None:
                reasons.append(f"{device.name} port {port.name}: unreadable rate {rate_text!r}")
            state = read_text_or_none(port / "state")
            layer = read_text_or_none(port / "link_layer")
            ports.append(
                NicPort(
                    device=device.name,
                    port=port.name,
                    rate_bits_per_s=rate,
                    link_layer=layer.strip() if layer else None,
                    # "4: ACTIVE"; a missing state file counts as active (older drivers)
                    active=state is None or "ACTIVE" in state.upper(),
                )
            )
    return ports


def _detect_ethernet(sysfs_root: Path) -> list[NicPort]:
    """Physical network interfaces that are up, from ``/sys/class/net/<if>/speed`` (Mb/s per
    direction); virtual ones (loopback, bridges, veth: no ``device`` link) are skipped."""
    ports = []
    for interface in list_dir(sysfs_root / "sys" / "class" / "net"):
        if not is_physical_netdev(interface):
            continue
        speed = read_text_or_none(interface / "speed")
        state = (read_text_or_none(interface / "operstate") or "").strip().lower()
        try:
            mbits = float(speed) if speed is not None else 0.0
        except ValueError:
            mbits = 0.0
        if mbits <= 0 or state not in ("up", "unknown"):
            continue
        ports.append(NicPort(interface.name, "1", mbits * 1e6, "Ethernet", True, rdma=False))
    return ports


def detect_hardware(
    nvml: Any = None,
    sysfs_root: str | os.PathLike[str] = "/",
    hostname_fn: Callable[[], str] = socket.gethostname,
) -> HardwareInfo:
    """Detect this node's GPUs (name, NVLink, PCIe, pairwise topology), RDMA NIC ports and
    hostname. Never raises for missing hardware or libraries: see `HardwareInfo.reasons`."""
    reasons: list[str] = []
    try:
        hostname: str | None = hostname_fn()
    except Exception as exc:
        hostname = None
        reasons.append(f"hostname unavailable: {_describe(exc)}")
    gpus, matrix = _detect_gpus(nvml, reasons)
    nics = _detect_nics(Path(sysfs_root), reasons)
    if not any(p.active and p.rate_bits_per_s for p in nics):
        nics = nics + _detect_ethernet(Path(sysfs_root))
    return HardwareInfo(
        hostname=hostname,
        gpus=tuple(gpus),
        topology=tuple(tuple(row) for row in matrix),
        nics=tuple(nics),
        reasons=tuple(reasons),
    )


def link_peaks(
    info: HardwareInfo | None, nvml_index: int, *, nics: bool | Collection[str]
) -> tuple[LinkPeak, ...]:
    """Spec unidirectional bytes/s of the links whose counters the rank samples: its GPU's
    (NVML index `nvml_index`) NVLink (links up x per-link rate) and PCIe (generation x width),
    and the sum over the active InfiniBand / RoCE ports of each kind (rates in
    `mfuscope.core.interconnects`) of the NICs it samples: `nics` True: all of the node's, else
    those whose device names it lists."""
    if info is None:
        return ()
    peaks: list[LinkPeak] = []
    gpu = next((g for g in info.gpus if g.index == nvml_index), None)
    if gpu is not None:
        per_link = NVLINK_PER_LINK_BYTES_PER_S.get(gpu.nvlink_generation or 0)
        if per_link is not None and gpu.nvlink_links_up:
            peaks.append(LinkPeak("nvlink", per_link * gpu.nvlink_links_up))
        per_lane = PCIE_PER_LANE_BYTES_PER_S.get(gpu.pcie_generation or 0)
        if per_lane is not None and gpu.pcie_width:
            peaks.append(LinkPeak("pcie", per_lane * gpu.pcie_width))
    if nics:
        sampled = [p for p in info.nics if nics is True or p.device in nics]
        for kind, link in (("infiniband", "ib"), ("roce", "roce")):
            rates = [p.rate_bits_per_s or 0.0 for p in sampled if p.active and p.kind == kind]
            if sum(rates) > 0:
                peaks.append(LinkPeak(link, sum(rates) / 8))
    return tuple(peaks)
