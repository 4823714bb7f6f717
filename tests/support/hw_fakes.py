"""Fakes at the hardware boundary: an NVML with settable counters, and a sysfs tree builder.

`CounterNvml` has pynvml's function names and return shapes (field values are objects with
``fieldId``, ``scopeId``, ``valueType``, ``nvmlReturn`` and a ``value`` union, as
``nvmlDeviceGetFieldValues`` returns them) for one H100 SXM: 18 NVLink 4 links, PCIe Gen5 x16.
Tests move its state (`memory_percent`, `sm_mhz`, `reasons`, `nvlink_kib`, ...) between samples.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

__all__ = ["CounterNvml", "FakeNvmlError", "NodeGpusNvml", "ib_port", "net_interface"]

NVLINK_TX, NVLINK_RX, PCIE_TX, PCIE_RX = 138, 139, 197, 198
NVLINK_TX_BYTES, NVLINK_RX_BYTES = 202, 204
VALUE_TYPE_ULL = 3


class FakeNvmlError(Exception):
    """Stands in for pynvml.NVMLError (e.g. NVMLError_NotSupported)."""


@dataclass
class CounterNvml:
    name: str = "NVIDIA H100 80GB HBM3"
    memory_percent: int = 0
    sm_mhz: int = 1980
    max_sm_mhz: int = 1980
    power_mw: int = 100_000
    energy_mj: int = 5_000_000
    reasons: int = 0
    nvlink_kib: dict[str, int] = field(default_factory=lambda: {"tx": 0, "rx": 0})
    pcie_bytes: dict[str, int] = field(default_factory=lambda: {"tx": 0, "rx": 0})
    pcie_kb_per_s: dict[str, int] = field(default_factory=lambda: {"tx": 0, "rx": 0})
    unsupported: set[str] = field(default_factory=set)  # function names (or "field:<id>")
    failing: set[str] = field(default_factory=set)  # raise once each, then work again
    # nvmlDeviceGetMigMode's [current, pending]; None: the GPU has no MIG (Not Supported)
    mig_mode: tuple[int, int] | None = None
    calls: list[str] = field(default_factory=list)
    field_queries: list[list[int]] = field(default_factory=list)  # field ids of each call
    shut_down: bool = False

    def _call(self, fn: str) -> None:
        self.calls.append(fn)
        if fn in self.unsupported:
            raise FakeNvmlError(f"{fn}: Not Supported")
        if fn in self.failing:
            self.failing.discard(fn)
            raise FakeNvmlError(f"{fn}: Unknown Error")

    # --- start-up and detection -----------------------------------------------------------------
    def nvmlInit(self) -> None:
        self._call("nvmlInit")

    def nvmlShutdown(self) -> None:
        self.shut_down = True

    def nvmlDeviceGetCount(self) -> int:
        return 1

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        self._call("nvmlDeviceGetHandleByIndex")
        return index

    def nvmlDeviceGetName(self, handle: int) -> str:
        return self.name

    def nvmlDeviceGetNvLinkState(self, handle: int, link: int) -> int:
        return 1

    def nvmlDeviceGetNvLinkVersion(self, handle: int, link: int) -> int:
        return 6  # NVLink 4.0

    def nvmlDeviceGetMaxPcieLinkGeneration(self, handle: int) -> int:
        return 5

    def nvmlDeviceGetMaxPcieLinkWidth(self, handle: int) -> int:
        return 16

    def nvmlDeviceGetMigMode(self, handle: int) -> list[int]:
        if self.mig_mode is None:
            raise FakeNvmlError("nvmlDeviceGetMigMode: Not Supported")
        return list(self.mig_mode)

    # --- counters -------------------------------------------------------------------------------
    def nvmlDeviceGetUtilizationRates(self, handle: int) -> Any:
        self._call("nvmlDeviceGetUtilizationRates")
        return SimpleNamespace(gpu=100, memory=self.memory_percent)

    def nvmlDeviceGetClockInfo(self, handle: int, clock: int) -> int:
        self._call("nvmlDeviceGetClockInfo")
        assert clock == 1  # NVML_CLOCK_SM
        return self.sm_mhz

    def nvmlDeviceGetMaxClockInfo(self, handle: int, clock: int) -> int:
        self._call("nvmlDeviceGetMaxClockInfo")
        return self.max_sm_mhz

    def nvmlDeviceGetPowerUsage(self, handle: int) -> int:
        self._call("nvmlDeviceGetPowerUsage")
        return self.power_mw

    def nvmlDeviceGetTotalEnergyConsumption(self, handle: int) -> int:
        self._call("nvmlDeviceGetTotalEnergyConsumption")
        return self.energy_mj

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle: int) -> int:
        self._call("nvmlDeviceGetCurrentClocksEventReasons")
        return self.reasons

    def nvmlDeviceGetPcieThroughput(self, handle: int, counter: int) -> int:
        self._call("nvmlDeviceGetPcieThroughput")
        return self.pcie_kb_per_s["tx" if counter == 0 else "rx"]

    def nvmlDeviceGetFieldValues(self, handle: int, field_ids: list[Any]) -> list[Any]:
        self._call("nvmlDeviceGetFieldValues")
        self.field_queries.append([field_id for field_id, _ in field_ids])
        out = []
        for field_id, scope in field_ids:
            value = {
                NVLINK_TX: self.nvlink_kib["tx"],
                NVLINK_RX: self.nvlink_kib["rx"],
                PCIE_TX: self.pcie_bytes["tx"],
                PCIE_RX: self.pcie_bytes["rx"],
                NVLINK_TX_BYTES: self.nvlink_kib["tx"] * 1024,
                NVLINK_RX_BYTES: self.nvlink_kib["rx"] * 1024,
            }[field_id]
            status = 3 if f"field:{field_id}" in self.unsupported else 0  # NOT_SUPPORTED
            out.append(
                SimpleNamespace(
                    fieldId=field_id,
                    scopeId=scope,
                    valueType=VALUE_TYPE_ULL,
                    nvmlReturn=status,
                    value=SimpleNamespace(ullVal=value),
                )
            )
        return out


def ib_port(
    root: Path,
    device: str,
    port: str = "1",
    *,
    xmit_words: int = 0,
    rcv_words: int = 0,
    link_layer: str = "InfiniBand",
    rate: str = "400 Gb/sec (4X NDR)",
    node_guid: str | None = None,
) -> Path:
    """Write (or update) an RDMA port under ``root/sys/class/infiniband``; counters in 4-byte
    words; `node_guid` the device's (``b859:9f03:00d4:4f2a`` form). Returns the port directory."""
    path = root / "sys" / "class" / "infiniband" / device / "ports" / port
    if node_guid is not None:
        path.parents[1].mkdir(parents=True, exist_ok=True)
        (path.parents[1] / "node_guid").write_text(f"{node_guid}\n")
    (path / "counters").mkdir(parents=True, exist_ok=True)
    (path / "rate").write_text(f"{rate}\n")
    (path / "state").write_text("4: ACTIVE\n")
    (path / "link_layer").write_text(f"{link_layer}\n")
    (path / "counters" / "port_xmit_data").write_text(f"{xmit_words}\n")
    (path / "counters" / "port_rcv_data").write_text(f"{rcv_words}\n")
    return path


def net_interface(
    root: Path,
    name: str,
    *,
    tx_bytes: int = 0,
    rx_bytes: int = 0,
    physical: bool = True,
    mac: str | None = None,
) -> Path:
    """Write (or update) ``root/sys/class/net/<name>``; `physical` adds the ``device`` entry,
    `mac` the ``address`` file."""
    path = root / "sys" / "class" / "net" / name
    (path / "statistics").mkdir(parents=True, exist_ok=True)
    if mac is not None:
        (path / "address").write_text(f"{mac}\n")
    if physical:
        (path / "device").mkdir(exist_ok=True)
    (path / "statistics" / "tx_bytes").write_text(f"{tx_bytes}\n")
    (path / "statistics" / "rx_bytes").write_text(f"{rx_bytes}\n")
    return path


@dataclass
class NodeGpusNvml(CounterNvml):
    """`CounterNvml` for a node of `count` GPUs in NVML's (PCI) order: GPU i has UUID
    ``GPU-0000000i-...`` and PCI bus id ``00000000:{0x18 + 0x10 i}:00.0`` (made-up, in NVML's
    formats); handles are NVML indices. The lookups by UUID and bus id raise like NVML's
    ``NVMLError_NotFound`` for an unknown key; `lookups` records every handle lookup.

    The GPUs in `mig_gpus` have MIG mode on with two slices each (UUIDs `mig_uuid_of`; a slice's
    handle is ``(gpu, slot)``); `pcie_widths[i]` is GPU i's PCIe width, so link facts show
    which GPU they came from."""

    count: int = 4
    lookups: list[tuple[str, Any]] = field(default_factory=list)
    handles_read: set[int] = field(default_factory=set)  # handles the counter reads went to
    mig_gpus: set[int] = field(default_factory=set)
    pcie_widths: tuple[int, ...] = (16, 16, 16, 16)

    @staticmethod
    def mig_uuid_of(index: int, slot: int) -> str:
        return f"MIG-{index:08x}-{slot:04x}-2222-3333-444444444444"

    def nvmlDeviceGetMigMode(self, handle: int) -> list[int]:
        if handle in self.mig_gpus:
            return [1, 1]
        return super().nvmlDeviceGetMigMode(handle)

    def nvmlDeviceGetMaxMigDeviceCount(self, handle: int) -> int:
        return 7 if handle in self.mig_gpus else 0

    def nvmlDeviceGetMigDeviceHandleByIndex(self, handle: int, slot: int) -> tuple[int, int]:
        if handle not in self.mig_gpus or slot >= 2:
            raise FakeNvmlError("Not Found")
        return (handle, slot)

    def nvmlDeviceGetMaxPcieLinkWidth(self, handle: int) -> int:
        return self.pcie_widths[handle]

    @staticmethod
    def uuid_of(index: int) -> str:
        return f"GPU-{index:08x}-1111-2222-3333-444444444444"

    @staticmethod
    def bus_id_of(index: int) -> str:
        return f"00000000:{0x18 + 0x10 * index:02X}:00.0"

    def nvmlDeviceGetCount(self) -> int:
        return self.count

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        self.lookups.append(("index", index))
        return super().nvmlDeviceGetHandleByIndex(index)

    def nvmlDeviceGetHandleByUUID(self, uuid: str) -> int:
        self._call("nvmlDeviceGetHandleByUUID")
        self.lookups.append(("uuid", uuid))
        for index in range(self.count):
            if self.uuid_of(index) == uuid:
                return index
        raise FakeNvmlError("Not Found")

    def nvmlDeviceGetHandleByPciBusId(self, bus_id: str) -> int:
        self._call("nvmlDeviceGetHandleByPciBusId")
        self.lookups.append(("pci_bus_id", bus_id))
        for index in range(self.count):
            if self.bus_id_of(index).lower() == bus_id.lower():
                return index
        raise FakeNvmlError("Not Found")

    def nvmlDeviceGetUUID(self, handle: int | tuple[int, int]) -> str:
        if isinstance(handle, tuple):
            return self.mig_uuid_of(*handle)
        return self.uuid_of(handle)

    def nvmlDeviceGetPciInfo(self, handle: int) -> Any:
        # pynvml's nvmlPciInfo_t: busId holds bytes (a c_char array).
        return SimpleNamespace(busId=self.bus_id_of(handle).encode())

    def nvmlDeviceGetUtilizationRates(self, handle: int) -> Any:
        self.handles_read.add(handle)
        return super().nvmlDeviceGetUtilizationRates(handle)

    def nvmlDeviceGetPowerUsage(self, handle: int) -> int:
        self.handles_read.add(handle)
        return super().nvmlDeviceGetPowerUsage(handle)

    def nvmlDeviceGetP2PStatus(self, a: int, b: int, index: int) -> int:
        return 0

    def properties_of(self, index: int, slot: int | None = None) -> Any:
        """What ``torch.cuda.get_device_properties`` says of the CUDA device that is NVML GPU
        `index` (or its MIG slice `slot`; a slice has its parent's PCI ids). torch prints the
        UUID without its ``GPU-`` / ``MIG-`` prefix; PCI ids are integers."""
        bus = 0x18 + 0x10 * index
        uuid = self.uuid_of(index) if slot is None else self.mig_uuid_of(index, slot)
        return SimpleNamespace(uuid=uuid[4:], pci_domain_id=0, pci_bus_id=bus, pci_device_id=0)
