"""Raw hardware-counter reads: NVML for the rank's GPU, sysfs for the node's NICs.

Each reader returns plain numbers in the device's own units and never raises for a missing
counter: a read the device does not support is dropped at the first try and stays absent (the
series is missing, not zero). Both boundaries are injected so tests run without a GPU or a NIC:

- `nvml`: an object with pynvml's function names (``nvidia-ml-py``); units as NVML returns them:
  utilisation in percent, clocks in MHz, power in mW, energy in mJ, NVLink data counters in KiB
  (``NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX/RX``, scope ``UINT_MAX`` = summed over the links), PCIe
  counters in bytes (``NVML_FI_DEV_PCIE_COUNT_TX/RX_BYTES``), PCIe throughput in KB/s.
- `sysfs_root`: the directory that plays ``/``. InfiniBand / RoCE ports:
  ``sys/class/infiniband/<dev>/ports/<n>/counters/port_{xmit,rcv}_data`` in units of 4 bytes
  (octets / 4, IBTA PortCounters), with ``link_layer`` ``InfiniBand`` or ``Ethernet`` (RoCE).
  Plain Ethernet: ``sys/class/net/<if>/statistics/{tx,rx}_bytes`` of physical interfaces (those
  with a ``device`` link) that no RDMA device owns, in bytes.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Collection
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from mfuscope.agent.gpu_identity import GpuRef, nvml_handle

__all__ = [
    "NVLINK_TX",
    "THROTTLE_REASON_BITS",
    "CounterRead",
    "NicDevice",
    "NicReader",
    "NvmlReader",
    "NvmlReading",
    "is_physical_netdev",
    "list_dir",
    "nic_devices",
    "nic_ids",
    "read_text_or_none",
]

# NVML field ids and scopes (nvml.h; the values pynvml 13 exports under the same names).
NVLINK_TX = 138  # NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, KiB
NVLINK_RX = 139  # NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX, KiB
NVLINK_TX_BYTES = 202  # NVML_FI_DEV_NVLINK_COUNT_XMIT_BYTES, bytes (newer drivers)
NVLINK_RX_BYTES = 204  # NVML_FI_DEV_NVLINK_COUNT_RCV_BYTES, bytes
PCIE_TX = 197  # NVML_FI_DEV_PCIE_COUNT_TX_BYTES, bytes
PCIE_RX = 198  # NVML_FI_DEV_PCIE_COUNT_RX_BYTES, bytes
ALL_LINKS_SCOPE = 0xFFFFFFFF  # scopeId UINT_MAX: the sum over every NVLink of the GPU
# (link, direction) <- NVML field, scope, bytes per unit; the first supported field of each
# (link, direction) is used, the others are dropped after the first read.
_FIELDS: tuple[tuple[tuple[str, str], int, int, int], ...] = (
    (("nvlink", "tx"), NVLINK_TX, ALL_LINKS_SCOPE, 1024),
    (("nvlink", "rx"), NVLINK_RX, ALL_LINKS_SCOPE, 1024),
    (("nvlink", "tx"), NVLINK_TX_BYTES, ALL_LINKS_SCOPE, 1),
    (("nvlink", "rx"), NVLINK_RX_BYTES, ALL_LINKS_SCOPE, 1),
    (("pcie", "tx"), PCIE_TX, 0, 1),
    (("pcie", "rx"), PCIE_RX, 0, 1),
)
_CLOCK_SM = 1  # NVML_CLOCK_SM
_PCIE_UTIL_TX, _PCIE_UTIL_RX = 0, 1  # NVML_PCIE_UTIL_TX_BYTES / _RX_BYTES
_NVML_SUCCESS = 0
# nvmlValueType_t -> counter width in bits (None: 64-bit, a decrease is a reset, not a wrap).
_VALUE_WIDTH: dict[int, tuple[str, int | None]] = {
    1: ("uiVal", 32),
    2: ("ulVal", None),
    3: ("ullVal", None),
    4: ("sllVal", None),
    5: ("siVal", 31),
    6: ("usVal", 16),
}

# nvmlClocksEventReason* bits that hold the SM clock below what the work asks for. Left out on
# purpose: GpuIdle (no work, not a slowdown), ApplicationsClocksSetting and DisplayClockSetting
# (clocks an administrator chose).
THROTTLE_REASON_BITS: dict[str, int] = {
    "sw_power_cap": 0x4,
    "hw_slowdown": 0x8,
    "sync_boost": 0x10,
    "sw_thermal": 0x20,
    "hw_thermal": 0x40,
    "hw_power_brake": 0x80,
}


@dataclass(frozen=True)
class CounterRead:
    """One cumulative counter read: `value` in units of `unit_bytes`, wrapping at `width_bits`."""

    value: int
    unit_bytes: int
    width_bits: int | None


@dataclass(frozen=True)
class NvmlReading:
    """One NVML sample of the rank's GPU; None where the read is unsupported or failed."""

    memory_busy_ratio: float | None = None
    sm_clock_ratio: float | None = None
    power_watts: float | None = None
    energy_mj: int | None = None
    throttle_mask: int | None = None
    counters: tuple[tuple[tuple[str, str], CounterRead], ...] = ()
    pcie_rates_bytes_per_s: tuple[tuple[str, float], ...] = ()


class NvmlReader:
    """Reads the rank's GPU `device`, found by UUID / PCI bus id (`gpu_identity.nvml_handle`).
    Construction raises if NVML cannot start or the GPU cannot be found safely (the sampler then
    runs without GPU counters); reads never raise. `found_by` says how the device was found
    (``uuid``, ``pci_bus_id``, ``index``)."""

    def __init__(self, nvml: Any, device: GpuRef) -> None:
        self._nvml = nvml
        nvml.nvmlInit()
        try:
            self._handle, self.found_by = nvml_handle(nvml, device)
        except Exception:
            with contextlib.suppress(Exception):
                nvml.nvmlShutdown()
            raise
        # Reads that failed on the first sample: unsupported here, never tried again.
        self._unsupported: set[str] = set()
        self._read_once = False
        self._field_sources = _FIELDS
        self.first_reasons: list[str] = []
        reasons = getattr(nvml, "nvmlDeviceGetCurrentClocksEventReasons", None)
        self._reasons_fn = reasons or getattr(
            nvml, "nvmlDeviceGetCurrentClocksThrottleReasons", None
        )

    def _try(self, what: str, fn: Callable[[], Any]) -> Any:
        if what in self._unsupported:
            return None
        try:
            return fn()
        except Exception as exc:  # NVMLError_NotSupported, NoPermission, an old binding...
            if not self._read_once:
                self._unsupported.add(what)
                self.first_reasons.append(f"{what}: {type(exc).__name__}")
            return None

    def _fields(self) -> tuple[tuple[tuple[str, str], CounterRead], ...]:
        fields = self._field_sources
        if not fields:
            return ()
        ids = [(field_id, scope) for _, field_id, scope, _ in fields]
        values = self._try(
            "field values", lambda: self._nvml.nvmlDeviceGetFieldValues(self._handle, ids)
        )
        if values is None:
            return ()
        out: dict[tuple[str, str], CounterRead] = {}
        used: set[int] = set()  # the field ids read
        for (key, field_id, _, unit), value in zip(fields, values, strict=False):
            kind = _VALUE_WIDTH.get(getattr(value, "valueType", -1))
            if key in out or getattr(value, "nvmlReturn", 1) != _NVML_SUCCESS or kind is None:
                continue
            attr, width = kind
            raw = int(getattr(value.value, attr))
            if raw >= 0:
                out[key] = CounterRead(raw, unit, width)
                used.add(field_id)
        if not self._read_once:
            # Keep the first field that worked for each (link, direction); drop the others.
            self._field_sources = tuple(f for f in fields if f[1] in used)
            missing = sorted({f"{k[0]} {k[1]}" for k, *_ in fields if k not in out})
            self.first_reasons.extend(f"field {name}: not supported" for name in missing)
        return tuple(sorted(out.items()))

    def _pcie_rates(self, have: set[str]) -> tuple[tuple[str, float], ...]:
        """PCIe KB/s (a 20 ms NVML sample) for directions without a byte counter."""
        rates = []
        for direction, counter in (("tx", _PCIE_UTIL_TX), ("rx", _PCIE_UTIL_RX)):
            if direction in have:
                continue
            kb = self._try(f"pcie throughput {direction}", partial(self._pcie_throughput, counter))
            if kb is not None:
                rates.append((direction, float(kb) * 1000.0))
        return tuple(rates)

    def _pcie_throughput(self, counter: int) -> Any:
        return self._nvml.nvmlDeviceGetPcieThroughput(self._handle, counter)

    def read(self) -> NvmlReading:
        nvml, handle = self._nvml, self._handle
        util = self._try("utilization", lambda: nvml.nvmlDeviceGetUtilizationRates(handle))
        clock = self._try("sm clock", lambda: nvml.nvmlDeviceGetClockInfo(handle, _CLOCK_SM))
        top = self._try("max sm clock", lambda: nvml.nvmlDeviceGetMaxClockInfo(handle, _CLOCK_SM))
        power = self._try("power", lambda: nvml.nvmlDeviceGetPowerUsage(handle))
        energy = self._try("energy", lambda: nvml.nvmlDeviceGetTotalEnergyConsumption(handle))
        fn = self._reasons_fn
        mask = None if fn is None else self._try("clock reasons", lambda: fn(handle))
        counters = self._fields()
        pcie_have = {d for (link, d), _ in counters if link == "pcie"}
        rates = self._pcie_rates(pcie_have)
        self._read_once = True
        memory = None if util is None else getattr(util, "memory", None)
        return NvmlReading(
            memory_busy_ratio=None if memory is None else min(max(memory / 100.0, 0.0), 1.0),
            sm_clock_ratio=min(clock / top, 1.0) if clock is not None and top else None,
            power_watts=None if power is None else power / 1000.0,
            energy_mj=None if energy is None else int(energy),
            throttle_mask=None if mask is None else int(mask),
            counters=counters,
            pcie_rates_bytes_per_s=rates,
        )

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self._nvml.nvmlShutdown()


def _read_int(path: Path) -> int | None:
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return None


@dataclass(frozen=True)
class NicDevice:
    """One NIC whose counters can be read: an RDMA device (``kind`` ``rdma``: its ports'
    counters) or a physical Ethernet interface no RDMA device owns (``ethernet``)."""

    kind: str
    name: str
    path: Path  # /sys/class/infiniband/<dev> or /sys/class/net/<if>

    @property
    def nic_id(self) -> str:
        """An id naming this NIC alike in every container of its node and on no other node: an
        RDMA device's node GUID, an interface's MAC address; the device name where the hardware
        id is missing or zero (unique on the node, which the id is scoped to)."""
        if self.kind == "rdma":
            guid = (read_text_or_none(self.path / "node_guid") or "").strip().lower()
            return f"guid:{guid}" if guid.strip("0:") else f"rdma:{self.name}"
        mac = (read_text_or_none(self.path / "address") or "").strip().lower()
        return f"mac:{mac}" if mac.strip("0:") else f"net:{self.name}"


def nic_devices(sysfs_root: str | Path = "/") -> list[NicDevice]:
    """The node's NICs under `sysfs_root`: RDMA devices, then the physical Ethernet interfaces
    that no RDMA device owns (a RoCE port's interface is counted by its RDMA device)."""
    root = Path(sysfs_root)
    found: list[NicDevice] = []
    rdma_netdevs: set[str] = set()
    for device in list_dir(root / "sys" / "class" / "infiniband"):
        rdma_netdevs.update(p.name for p in list_dir(device / "device" / "net"))
        found.append(NicDevice("rdma", device.name, device))
    for netdev in list_dir(root / "sys" / "class" / "net"):
        if netdev.name not in rdma_netdevs and is_physical_netdev(netdev):
            found.append(NicDevice("ethernet", netdev.name, netdev))
    return found


def nic_ids(sysfs_root: str | Path = "/") -> dict[str, str]:
    """Device name -> `NicDevice.nic_id` for the node's NICs."""
    return {device.name: device.nic_id for device in nic_devices(sysfs_root)}


class NicReader:
    """Reads the node's RDMA ports and physical Ethernet interfaces under `sysfs_root`; with
    `devices`, only the NICs of those names (the ones this rank samples for its node)."""

    def __init__(
        self, sysfs_root: str | Path = "/", devices: Collection[str] | None = None
    ) -> None:
        self.ports: list[tuple[str, str, Path]] = []  # (link, name, counters directory)
        for nic in nic_devices(sysfs_root):
            if devices is not None and nic.name not in devices:
                continue
            if nic.kind == "ethernet":
                self.ports.append(("ethernet", nic.name, nic.path / "statistics"))
                continue
            for port in list_dir(nic.path / "ports"):
                layer = (read_text_or_none(port / "link_layer") or "InfiniBand").strip().lower()
                link = "roce" if layer == "ethernet" else "ib"
                self.ports.append((link, f"{nic.name}/{port.name}", port / "counters"))

    def read(self) -> dict[tuple[str, str, str], CounterRead]:
        """``(link, direction, port) -> counter``; unreadable files are left out."""
        out: dict[tuple[str, str, str], CounterRead] = {}
        for link, name, folder in self.ports:
            if link == "ethernet":
                files = (("tx", "tx_bytes"), ("rx", "rx_bytes"))
            else:
                files = (("tx", "port_xmit_data"), ("rx", "port_rcv_data"))
            for direction, filename in files:
                value = _read_int(folder / filename)
                if value is None or value < 0:
                    continue
                if link == "ethernet":
                    out[(link, direction, name)] = CounterRead(value, 1, None)
                else:
                    # A value past 32 bits proves a 64-bit (PortCountersExtended) counter.
                    width = 32 if value < (1 << 32) else None
                    out[(link, direction, name)] = CounterRead(value, 4, width)
        return out


def is_physical_netdev(netdev: Path) -> bool:
    """A network interface backed by hardware: it has a ``device`` link (loopback, bridges and
    veth pairs do not)."""
    return (netdev / "device").exists()


def list_dir(path: Path) -> list[Path]:
    """The entries of `path`, sorted; none when it cannot be listed."""
    try:
        return sorted(path.iterdir())
    except OSError:
        return []


def read_text_or_none(path: Path) -> str | None:
    """The text of `path`; None when it cannot be read."""
    try:
        return path.read_text()
    except OSError:
        return None
