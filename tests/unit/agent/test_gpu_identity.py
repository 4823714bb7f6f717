"""The rank's NVML device comes from its CUDA device's UUID / PCI bus id, not the CUDA index,
for counters, link facts, MIG mode (the peak) and validate-gpu alike (NVML faked at the
boundary: a node of four GPUs in PCI order; CUDA faked where the agent reads it)."""

from __future__ import annotations

import logging
from pathlib import Path
from types import SimpleNamespace

import pytest
from mfuscope.agent._agent import Seams
from mfuscope.agent._health import RateLimitedLog
from mfuscope.agent._hw_readers import NvmlReader
from mfuscope.agent._topology import build_topology
from mfuscope.agent.config import AgentConfig
from mfuscope.agent.detect import detect_hardware
from mfuscope.agent.gpu_identity import (
    GpuRef,
    gpu_ref_from_properties,
    match_gpu,
    normalise_bus_id,
    nvml_handle,
    runs_in_mig_mode,
)
from mfuscope.agent.hwcounters import build_hardware_sampler

from tests.support.hw_fakes import NodeGpusNvml

REORDERED = {"CUDA_VISIBLE_DEVICES": "3,1"}


def _ref(nvml: NodeGpusNvml, cuda_index: int, physical: int, env: dict[str, str]) -> GpuRef:
    """The ref torch would give for CUDA device `cuda_index`, which is NVML GPU `physical`."""
    return gpu_ref_from_properties(cuda_index, nvml.properties_of(physical), env)


def test_reordered_visible_devices_pick_the_gpu_by_bus_id_and_uuid() -> None:
    nvml = NodeGpusNvml()
    # CUDA_VISIBLE_DEVICES=3,1: CUDA device 0 is NVML GPU 3, CUDA device 1 is NVML GPU 1.
    for cuda_index, physical in ((0, 3), (1, 1)):
        ref = _ref(nvml, cuda_index, physical, REORDERED)
        assert ref.uuid == NodeGpusNvml.uuid_of(physical)
        assert ref.pci_bus_id == NodeGpusNvml.bus_id_of(physical)
        assert nvml_handle(nvml, ref) == (physical, "uuid")
        by_bus = GpuRef(cuda_index, pci_bus_id=ref.pci_bus_id, visible_devices="3,1")
        assert nvml_handle(nvml, by_bus) == (physical, "pci_bus_id")
    assert not [kind for kind, _ in nvml.lookups if kind == "index"]


def test_the_sampler_reads_the_reordered_gpu() -> None:
    nvml = NodeGpusNvml()
    reader = NvmlReader(nvml, _ref(nvml, 0, 3, REORDERED))
    assert reader.found_by == "uuid"
    reader.read()
    # The reads went to GPU 3 (handles are NVML indices in the fake), not to GPU 0.
    assert nvml.handles_read == {3}
    sampler = build_hardware_sampler(
        gpu=_ref(nvml, 0, 3, REORDERED),
        sample_nics=False,
        log=RateLimitedLog(60.0, logger=logging.getLogger("test")),
        nvml=nvml,
    )
    assert sampler.snapshot() is not None
    sampler.stop()


def test_detection_facts_are_matched_by_identity() -> None:
    nvml = NodeGpusNvml()
    info = detect_hardware(nvml=nvml, sysfs_root="/nonexistent")
    assert [g.pci_bus_id for g in info.gpus] == [NodeGpusNvml.bus_id_of(i) for i in range(4)]
    matched = match_gpu(info.gpus, _ref(nvml, 0, 3, REORDERED))
    assert matched is not None and matched.index == 3
    # Bus id only (an NVML binding without UUIDs): still GPU 3.
    bare = [g.__class__(g.index, g.name, pci_bus_id=g.pci_bus_id) for g in info.gpus]
    only_bus = GpuRef(0, pci_bus_id="0000:48:00.0", visible_devices="3,1")  # legacy form
    matched = match_gpu(bare, only_bus)
    assert matched is not None and matched.index == 3


def test_the_cuda_index_stands_in_only_without_visible_devices() -> None:
    nvml = NodeGpusNvml()
    unset = GpuRef(cuda_index=2)  # CUDA_VISIBLE_DEVICES unset, no ids (an older torch)
    assert nvml_handle(nvml, unset) == (2, "index")
    hidden = GpuRef(cuda_index=0, visible_devices="3,1")
    with pytest.raises(LookupError, match="CUDA_VISIBLE_DEVICES='3,1'"):
        nvml_handle(nvml, hidden)
    info = detect_hardware(nvml=nvml, sysfs_root="/nonexistent")
    assert match_gpu(info.gpus, hidden) is None
    matched = match_gpu(info.gpus, unset)
    assert matched is not None and matched.index == 2
    # The sampler then runs without GPU counters instead of reading the wrong GPU.
    sampler = build_hardware_sampler(
        gpu=hidden,
        sample_nics=False,
        log=RateLimitedLog(60.0, logger=logging.getLogger("test")),
        nvml=nvml,
    )
    assert sampler.snapshot() is None
    sampler.stop()


@pytest.mark.parametrize(
    ("properties", "uuid", "bus"),
    [
        (
            SimpleNamespace(uuid="8a3c-x", pci_domain_id=1, pci_bus_id=0x3B, pci_device_id=2),
            "GPU-8a3c-x",
            "00000001:3B:02.0",
        ),
        (SimpleNamespace(uuid="MIG-ab"), "MIG-ab", None),  # an older torch: no PCI ids
        (SimpleNamespace(), None, None),
    ],
)
def test_ref_from_torch_properties(properties: object, uuid: str | None, bus: str | None) -> None:
    ref = gpu_ref_from_properties(0, properties, {})
    assert (ref.uuid, ref.pci_bus_id, ref.index_is_physical) == (uuid, bus, True)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("0000:3b:00.0", "00000000:3B:00.0"),
        ("00000000:3B:00.0", "00000000:3B:00.0"),
        ("3b:00.0", None),
        ("zz:3b:00.0", None),
        ("", None),
    ],
)
def test_normalise_bus_id(text: str, expected: str | None) -> None:
    assert normalise_bus_id(text) == expected


H100 = "NVIDIA H100 80GB HBM3"
H100_BF16 = 989.4e12  # dense, the hardware table's figure


@pytest.mark.parametrize(
    ("visible", "cuda_index", "physical"),
    [("2,3", 0, 2), ("2,3", 1, 3), ("3,1", 0, 3), ("3,1", 1, 1)],
)
def test_mig_peak_links_and_counters_follow_the_physical_gpu(
    visible: str, cuda_index: int, physical: int, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # Four GPUs with different PCIe widths; only GPU 3 runs in MIG mode, and the CUDA name
    # carries no MIG profile, so a rank on GPU 3 must get an unknown peak, never a whole H100's.
    import torch
    from mfuscope.agent import _runtime

    nvml = NodeGpusNvml(mig_gpus={3}, pcie_widths=(16, 8, 4, 2))
    env = {"CUDA_VISIBLE_DEVICES": visible}
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: cuda_index)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda index=None: H100)
    # What torch says of CUDA device `cuda_index`: the ids of NVML GPU `physical`.
    monkeypatch.setattr(
        _runtime,
        "cuda_gpu_ref",
        lambda index: gpu_ref_from_properties(index, nvml.properties_of(physical), env),
    )
    log = RateLimitedLog(60.0, logger=logging.getLogger("test"))
    topology = build_topology(rank=0, local_rank=0, hosts=["a"], groups=())
    seams = Seams(nvml=nvml, sysfs_root=str(tmp_path))
    device = _runtime._device(None, topology, log, seams)
    assert (device.index, device.nvml_index) == (cuda_index, physical)
    assert device.links.pcie_width == nvml.pcie_widths[physical]
    peak, source = _runtime._peak(AgentConfig(job="j", dtype="bf16"), device, log)
    if physical == 3:
        assert (peak, source) == (None, "unknown")
    else:
        assert (peak, source) == (pytest.approx(H100_BF16), "spec")
    nvml.lookups.clear()  # detection enumerates every GPU by NVML index; the sampler must not
    sampler = _runtime._hardware(AgentConfig(job="j"), device, topology, seams, log, node_nics={})
    assert sampler is not None
    sampler.stop()
    assert nvml.handles_read == {physical}
    assert not [kind for kind, _ in nvml.lookups if kind == "index"]


def test_a_mig_slice_is_found_on_its_gpu_by_its_own_uuid() -> None:
    nvml = NodeGpusNvml(mig_gpus={3})
    info = detect_hardware(nvml=nvml, sysfs_root="/nonexistent")
    assert info.gpus[3].mig_uuids == (nvml.mig_uuid_of(3, 0), nvml.mig_uuid_of(3, 1))
    assert info.gpus[0].mig_uuids == ()
    # An older torch gives the slice's UUID (bare: read as GPU-...) and no PCI ids.
    slice_ref = GpuRef(0, uuid="GPU-" + nvml.mig_uuid_of(3, 1)[4:], visible_devices="3")
    matched = match_gpu(info.gpus, slice_ref)
    assert matched is not None and matched.index == 3
    assert runs_in_mig_mode(info.gpus, slice_ref)
    by_bus = gpu_ref_from_properties(
        0, nvml.properties_of(3, slot=0), {"CUDA_VISIBLE_DEVICES": "3"}
    )
    assert runs_in_mig_mode(info.gpus, by_bus)


def test_an_unmatched_gpu_on_a_node_with_mig_is_not_given_a_whole_gpu_peak() -> None:
    hidden = GpuRef(cuda_index=0, visible_devices="2,3")  # no ids: cannot be matched
    with_mig = detect_hardware(nvml=NodeGpusNvml(mig_gpus={3}), sysfs_root="/nonexistent")
    without = detect_hardware(nvml=NodeGpusNvml(), sysfs_root="/nonexistent")
    assert runs_in_mig_mode(with_mig.gpus, hidden)
    assert not runs_in_mig_mode(without.gpus, hidden)
    assert not runs_in_mig_mode(with_mig.gpus, None)  # no GPU at all (a CPU run)


@pytest.mark.parametrize(
    ("visible", "cuda_index", "physical", "mig"),
    [("2,3", 0, 2, False), ("2,3", 1, 3, True), ("3,1", 0, 3, True), ("3,1", 1, 1, False)],
)
def test_validate_gpu_reads_nvml_of_the_physical_gpu(
    visible: str, cuda_index: int, physical: int, mig: bool
) -> None:
    from mfuscope.cli.validate_gpu._probes import nvml_view

    nvml = NodeGpusNvml(mig_gpus={3})
    nvml.name = "NVIDIA H100 80GB HBM3"
    ref = gpu_ref_from_properties(
        cuda_index, nvml.properties_of(physical), {"CUDA_VISIBLE_DEVICES": visible}
    )
    assert nvml_view(ref, nvml) == ("NVIDIA H100 80GB HBM3", mig)
    name, _ = nvml_view(GpuRef(cuda_index, visible_devices=visible), nvml)
    assert name.startswith("unavailable (no NVML GPU matches CUDA device")
