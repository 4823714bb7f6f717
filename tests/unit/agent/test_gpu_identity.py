"""The rank's NVML device comes from its CUDA device's UUID / PCI bus id, not the CUDA index
(NVML faked at the boundary: a node of four GPUs in PCI order)."""

from __future__ import annotations

import logging
from types import SimpleNamespace

import pytest
from mfuscope.agent._health import RateLimitedLog
from mfuscope.agent._hw_readers import NvmlReader
from mfuscope.agent.detect import detect_hardware
from mfuscope.agent.gpu_identity import (
    GpuRef,
    gpu_ref_from_properties,
    match_gpu,
    normalise_bus_id,
    nvml_handle,
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
        gpu_index=0,
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
        gpu_index=0,
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
