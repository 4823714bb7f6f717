"""Hardware detection with a fake NVML and a fake sysfs tree; real pynvml degrades here."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from mfuscope.agent.detect import (
    NVLINK_ENUM_TO_GENERATION,
    detect_hardware,
    parse_ib_rate_bits_per_s,
)
from mfuscope.core.hardware import link_for_tier, lookup_peak


class FakeNVMLError(Exception):
    """Stands in for pynvml.NVMLError."""


class FakeNvml:
    """The subset of pynvml that detect uses, for an 8-GPU HGX H100 board (NVLink enum 6 = 4.0)."""

    NVMLError = FakeNVMLError

    def __init__(
        self,
        count: int = 8,
        name: str | bytes = "NVIDIA H100 80GB HBM3",
        links: int = 18,
        version_enum: int = 6,
        fail: set[str] | None = None,
    ) -> None:
        self.count = count
        self.name = name
        self.links = links
        self.version_enum = version_enum
        self.fail = fail or set()
        self.shutdown = False

    def _maybe_fail(self, fn: str) -> None:
        if fn in self.fail:
            raise FakeNVMLError(f"{fn}: Not Supported")

    def nvmlInit(self) -> None:
        self._maybe_fail("nvmlInit")

    def nvmlShutdown(self) -> None:
        self.shutdown = True

    def nvmlDeviceGetCount(self) -> int:
        self._maybe_fail("nvmlDeviceGetCount")
        return self.count

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        return index

    def nvmlDeviceGetName(self, handle: int) -> str | bytes:
        self._maybe_fail("nvmlDeviceGetName")
        return self.name

    def nvmlDeviceGetNvLinkState(self, handle: int, link: int) -> int:
        if link >= self.links:
            raise FakeNVMLError("Invalid Argument")
        return 1

    def nvmlDeviceGetNvLinkVersion(self, handle: int, link: int) -> int:
        self._maybe_fail("nvmlDeviceGetNvLinkVersion")
        return self.version_enum

    def nvmlDeviceGetMaxPcieLinkGeneration(self, handle: int) -> int:
        self._maybe_fail("nvmlDeviceGetMaxPcieLinkGeneration")
        return 5

    def nvmlDeviceGetMaxPcieLinkWidth(self, handle: int) -> int:
        return 16

    def nvmlDeviceGetP2PStatus(self, a: int, b: int, index: int) -> int:
        return 0 if self.links else 4  # 4: NVML_P2P_STATUS_NOT_SUPPORTED

    def nvmlDeviceGetTopologyCommonAncestor(self, a: int, b: int) -> int:
        return 40 if (a < 4) == (b < 4) else 50  # NODE within a socket, SYS across


def _ib_port(root: Path, device: str, port: str, rate: str, state: str, layer: str) -> None:
    path = root / "sys" / "class" / "infiniband" / device / "ports" / port
    path.mkdir(parents=True)
    (path / "rate").write_text(rate + "\n")
    (path / "state").write_text(state + "\n")
    (path / "link_layer").write_text(layer + "\n")


def test_hgx_h100_node(tmp_path: Path) -> None:
    _ib_port(tmp_path, "mlx5_0", "1", "400 Gb/sec (4X NDR)", "4: ACTIVE", "InfiniBand")
    _ib_port(tmp_path, "mlx5_1", "1", "400 Gb/sec (4X NDR)", "1: DOWN", "InfiniBand")
    nvml = FakeNvml()
    info = detect_hardware(nvml=nvml, sysfs_root=tmp_path, hostname_fn=lambda: "node-7")
    assert info.hostname == "node-7"
    assert info.device_name == "NVIDIA H100 80GB HBM3"
    assert len(info.gpus) == 8
    gpu = info.gpus[0]
    assert (gpu.nvlink_generation, gpu.nvlink_links_up) == (4, 18)
    assert (gpu.pcie_generation, gpu.pcie_width) == (5, 16)
    assert info.topology[0][0] == "X"
    assert info.topology[0][7] == "NV18"
    assert [p.active for p in info.nics] == [True, False]
    assert info.reasons == ()
    assert nvml.shutdown
    # detection feeds the pure core: peak by name, tiers by detected links
    assert lookup_peak(info.device_name or "", "bf16").device_key == "h100-sxm"
    links = info.links_for(0)
    intra = link_for_tier("intra_node", info.device_name, links)
    assert intra is not None and intra.unidirectional_bytes_per_s == pytest.approx(450e9)
    inter = link_for_tier("inter_node", info.device_name, links)
    assert inter is not None
    assert (inter.kind, inter.unidirectional_bytes_per_s) == ("infiniband", pytest.approx(50e9))


def test_pcie_only_node_and_roce(tmp_path: Path) -> None:
    _ib_port(tmp_path, "mlx5_0", "1", "100 Gb/sec (4X EDR)", "4: ACTIVE", "Ethernet")
    nvml = FakeNvml(count=2, name=b"NVIDIA L40S", links=0)
    info = detect_hardware(nvml=nvml, sysfs_root=tmp_path, hostname_fn=lambda: "n")
    assert info.device_name == "NVIDIA L40S"  # bytes from old bindings decoded
    assert info.gpus[0].nvlink_links_up == 0
    assert info.topology == (("X", "NODE"), ("NODE", "X"))
    links = info.links_for(0)
    intra = link_for_tier("intra_node", info.device_name, links)
    assert intra is not None and intra.name == "pcie5-x16"
    inter = link_for_tier("inter_node", info.device_name, links)
    assert inter is not None
    assert (inter.kind, inter.unidirectional_bytes_per_s) == ("roce", pytest.approx(12.5e9))


@pytest.mark.parametrize(("enum", "generation"), [(4, 3), (5, 3), (6, 4), (7, 5), (3, 2)])
def test_nvlink_version_enum_is_mapped(tmp_path: Path, enum: int, generation: int) -> None:
    # NVML returns nvmlNvlinkVersion_t (an A100 reports 5 = NVLink 3.1), not the generation.
    assert NVLINK_ENUM_TO_GENERATION[enum] == generation
    info = detect_hardware(nvml=FakeNvml(count=1, version_enum=enum), sysfs_root=tmp_path)
    assert info.gpus[0].nvlink_generation == generation


def test_every_failure_degrades_with_a_reason(tmp_path: Path) -> None:
    nvml = FakeNvml(
        count=2,
        fail={
            "nvmlDeviceGetName",
            "nvmlDeviceGetMaxPcieLinkGeneration",
            "nvmlDeviceGetNvLinkVersion",
        },
    )

    def no_hostname() -> str:
        raise OSError("no hostname")

    info = detect_hardware(nvml=nvml, sysfs_root=tmp_path, hostname_fn=no_hostname)
    assert info.hostname is None
    assert info.device_name is None
    assert info.gpus[0].pcie_generation is None
    assert info.gpus[0].nvlink_generation is None
    assert info.gpus[0].nvlink_links_up == 18
    text = " | ".join(info.reasons)
    for fragment in ("hostname", "GPU 0 name", "PCIe generation", "version is unknown", "RDMA"):
        assert fragment in text
    # unknown links on an unknown device: no tier (no invented PCIe Gen4 x16 figure)
    assert link_for_tier("intra_node", info.device_name, info.links_for(0)) is None


def test_nvml_init_failure(tmp_path: Path) -> None:
    info = detect_hardware(nvml=FakeNvml(fail={"nvmlInit"}), sysfs_root=tmp_path)
    assert info.gpus == ()
    assert any("NVML unavailable" in r for r in info.reasons)


def test_real_pynvml_without_a_gpu_degrades(tmp_path: Path) -> None:
    # FACTS: here nvmlInit raises NVMLError_LibraryNotFound. No exception may escape.
    pynvml: Any = pytest.importorskip("pynvml")
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        pass
    else:  # pragma: no cover - only on a machine with a GPU
        pynvml.nvmlShutdown()
        pytest.skip("a GPU is present: this test covers the no-GPU path")
    info = detect_hardware(sysfs_root=tmp_path)
    assert info.gpus == ()
    assert info.device_name is None
    assert any("NVML" in r and "NVMLError" in r for r in info.reasons)
    assert info.hostname


def test_unreadable_nic_rate(tmp_path: Path) -> None:
    _ib_port(tmp_path, "hfi1_0", "1", "garbage", "4: ACTIVE", "InfiniBand")
    info = detect_hardware(nvml=FakeNvml(count=0), sysfs_root=tmp_path)
    assert info.nics[0].rate_bits_per_s is None
    assert info.links_for(0).nic_rates_bits_per_s == ()
    assert any("unreadable rate" in r for r in info.reasons)
    assert any("no GPU" in r for r in info.reasons)


@pytest.mark.parametrize(
    ("text", "bits"),
    [
        ("400 Gb/sec (4X NDR)", 400e9),
        ("200 Gb/sec (4X HDR)", 200e9),
        ("100 Gb/sec (4X EDR)", 100e9),
        ("2.5 Gb/sec (1X SDR)", 2.5e9),
        ("", None),
        ("fast", None),
        ("0 Gb/sec", None),
    ],
)
def test_parse_ib_rate(text: str, bits: float | None) -> None:
    assert parse_ib_rate_bits_per_s(text) == bits
