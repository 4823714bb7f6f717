"""Group link specs: the per-node NIC aggregate, every spec's source, and explicit unknowns.

Reference numbers (docs/definitions.md#link-specs): NDR 400G = 400e9 / 8 = 50e9 bytes/s per port
and direction; HDR 200G = 25e9; nccl-tests across 8 x A100 nodes with 4 x HDR measures 85-96 GB/s
busbw against 4 x 25e9 = 100e9 (NVIDIA/nccl-tests issues).
"""

from __future__ import annotations

import pytest
from mfuscope.core.bandwidth import busbw_bytes_per_s
from mfuscope.core.interconnects import DetectedLinks
from mfuscope.core.link_specs import (
    LinkSpec,
    UserLinks,
    group_link_spec,
    inter_node_spec,
    intra_node_spec,
    node_nic_aggregate_bytes_per_s,
)
from mfuscope.core.vocabulary import LINK_SPEC_SOURCES

NDR = 400e9  # bits/s per port, per direction
HDR = 200e9
H100 = "NVIDIA H100 80GB HBM3"


@pytest.mark.parametrize(
    ("ranks_on_node", "ports", "expected"),
    [
        # a dp group with one rank per node on an 8 x NDR node drives one NIC: 50e9
        (1, (NDR,) * 8, 50e9),
        # a group with 4 of its ranks on the node drives 4 NICs: 4 x 50e9
        (4, (NDR,) * 8, 200e9),
        # all 8 local ranks: the node's full aggregate, 8 x 50e9 = 4e11
        (8, (NDR,) * 8, 400e9),
        # 8 ranks but only 4 NICs (a DGX-1-like node): capped at the 4 ports, 4 x 25e9
        (8, (HDR,) * 4, 100e9),
        # mixed ports: the 2 fastest, (400 + 200) / 8 = 75e9
        (2, (100e9, NDR, HDR), 75e9),
    ],
)
def test_node_aggregate_is_min_ranks_nics_times_rate(
    ranks_on_node: int, ports: tuple[float, ...], expected: float
) -> None:
    assert node_nic_aggregate_bytes_per_s(ranks_on_node, ports) == pytest.approx(expected)


def test_node_aggregate_without_ports_is_unknown() -> None:
    assert node_nic_aggregate_bytes_per_s(4, ()) is None
    assert node_nic_aggregate_bytes_per_s(4, (0.0,)) is None
    with pytest.raises(ValueError, match="ranks_on_node"):
        node_nic_aggregate_bytes_per_s(0, (NDR,))


def test_measured_nccl_tests_busbw_is_85_percent_of_the_aggregate_not_340_of_one_port() -> None:
    # 16-rank all_reduce across 2 nodes of 8 A100s with 4 x HDR each: nccl-tests reads ~85 GB/s.
    # busbw = S / t x 2(n-1)/n; with S = 1 GiB, t = S x 1.875 / 85e9.
    size = 1 << 30
    seconds = size * 2 * 15 / 16 / 85e9
    busbw = busbw_bytes_per_s("all_reduce", 16, size, seconds)
    detected = DetectedLinks(nic_rates_bits_per_s=(HDR,) * 4, nic_kind="infiniband")
    spec = inter_node_spec("NVIDIA A100-SXM4-80GB", 8, detected)
    assert (spec.source, spec.bytes_per_s) == ("sysfs", pytest.approx(100e9))
    assert busbw / (spec.bytes_per_s or 0) == pytest.approx(0.85)
    # one port would have been 25e9: 340 %, an efficiency no fabric reaches
    assert busbw / 25e9 == pytest.approx(3.4)


def test_sysfs_ports_give_the_group_its_share_of_the_node() -> None:
    detected = DetectedLinks(nic_rates_bits_per_s=(NDR,) * 8, nic_kind="infiniband")
    one = group_link_spec("inter_node", H100, ranks_on_node=1, detected=detected)
    eight = group_link_spec("inter_node", H100, ranks_on_node=8, detected=detected)
    assert (one.source, one.bytes_per_s) == ("sysfs", pytest.approx(50e9))
    assert (eight.source, eight.bytes_per_s) == ("sysfs", pytest.approx(400e9))
    assert "8 of 8 active infiniband ports" in eight.detail


def test_datasheet_reference_system_has_one_nic_per_gpu() -> None:
    # DGX H100: one NDR 400G NIC per GPU; 4 ranks of the group on the node: 4 x 50e9 = 2e11.
    spec = inter_node_spec(H100, 4, DetectedLinks())
    assert (spec.source, spec.bytes_per_s) == ("datasheet", pytest.approx(200e9))


def test_user_settings_win_over_detection_and_datasheet() -> None:
    detected = DetectedLinks(
        nvlink_generation=4, nvlink_links_up=18, nic_rates_bits_per_s=(NDR,) * 8
    )
    user = UserLinks(intra_node_bytes_per_s=300e9, nic_bytes_per_s=25e9, nic_count=2)
    intra = intra_node_spec(H100, detected, user)
    inter = inter_node_spec(H100, 8, detected, user)
    assert (intra.source, intra.bytes_per_s) == ("user", 300e9)
    # 8 ranks on the node, 2 user-stated NICs of 25e9: min(8, 2) x 25e9 = 5e10
    assert (inter.source, inter.bytes_per_s) == ("user", pytest.approx(50e9))
    # a NIC count alone caps the detected ports: min(8, 2) fastest NDR ports = 2 x 50e9
    capped = inter_node_spec(H100, 8, detected, UserLinks(nic_count=2))
    assert (capped.source, capped.bytes_per_s) == ("sysfs", pytest.approx(100e9))


def test_nvml_links_inside_the_node() -> None:
    # 12 of 18 NVLink4 links up: 12 x 25e9 = 3e11, from NVML rather than the datasheet's 4.5e11
    detected = DetectedLinks(nvlink_generation=4, nvlink_links_up=12)
    spec = intra_node_spec(H100, detected)
    assert (spec.source, spec.bytes_per_s) == ("nvml", pytest.approx(300e9))
    assert intra_node_spec(H100).source == "datasheet"
    assert intra_node_spec(H100).bytes_per_s == pytest.approx(450e9)


@pytest.mark.parametrize("device", [None, "Mystery Accelerator 3000"])
def test_cpu_and_unknown_devices_get_unknown_specs_not_pcie_or_100gbe(device: str | None) -> None:
    for tier in ("intra_node", "inter_node", "unknown"):
        spec = group_link_spec(tier, device, ranks_on_node=2, detected=DetectedLinks())
        assert (spec.source, spec.bytes_per_s) == ("unknown", None)


def test_a_pcie_card_without_visible_nics_has_no_inter_node_spec() -> None:
    spec = inter_node_spec("NVIDIA L40S", 4, DetectedLinks())
    assert (spec.source, spec.bytes_per_s) == ("unknown", None)
    assert "nic_bytes_per_s" in spec.detail


def test_link_spec_invariants() -> None:
    assert LINK_SPEC_SOURCES == ("datasheet", "sysfs", "nvml", "user", "unknown")
    with pytest.raises(ValueError, match="exactly"):
        LinkSpec(None, "datasheet", "")
    with pytest.raises(ValueError, match="exactly"):
        LinkSpec(1e9, "unknown", "")
    with pytest.raises(ValueError, match="source"):
        LinkSpec(1e9, "guess", "")
    with pytest.raises(ValueError, match="nic_count"):
        UserLinks(nic_count=0)
