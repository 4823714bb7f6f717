"""Link tiers: unidirectional peaks, default latencies, detected links and the nccl-tests check."""

from __future__ import annotations

import pytest
from mfuscope.core.bandwidth import busbw_bytes_per_s
from mfuscope.core.hardware import (
    default_link_models,
    default_link_tiers,
    link_for_tier,
    tier_peak_bytes_per_s,
)
from mfuscope.core.interconnects import LINK_TIERS, DetectedLinks, LinkTier, link_tier

GB = 1e9


@pytest.mark.parametrize(
    ("name", "unidirectional_gb_s"),
    [
        # ml-engineering "Networking" (seed): NVLink 2/3/4 = 6/12/18 links x 25 GB/s per direction
        ("nvlink2", 150),
        ("nvlink3", 300),
        ("nvlink4", 450),
        ("nvlink5", 900),
        # same seed, xGMI table: MI250X 7 x 50, MI300X 7 x 64
        ("xgmi-mi250x", 350),
        ("xgmi-mi300x", 448),
        # same seed, PCIe table (x16, per direction): 31 / 63 / 121 GB/s (rounded there)
        ("pcie4-x16", 31.5),
        ("pcie5-x16", 63),
        ("pcie6-x16", 121),
        # same seed, InfiniBand 4X: EDR 100, HDR 200, NDR 400, XDR 800 Gb/s
        ("ib-edr", 12.5),
        ("ib-hdr", 25),
        ("ib-ndr", 50),
        ("ib-xdr", 100),
        ("eth-100g", 12.5),
        ("roce-400g", 50),
    ],
)
def test_tier_rates_are_unidirectional(name: str, unidirectional_gb_s: float) -> None:
    tier = link_tier(name)
    assert tier.unidirectional_bytes_per_s == pytest.approx(unidirectional_gb_s * GB)


def test_default_latencies_order_the_tiers() -> None:
    # seed "The Memory Hierarchy of a Cluster": NVLink ~1 us, InfiniBand ~2 us, Ethernet 10-50 us
    assert link_tier("nvlink4").alpha_s == pytest.approx(1e-6)
    assert link_tier("ib-ndr").alpha_s == pytest.approx(2e-6)
    assert link_tier("eth-100g").alpha_s == pytest.approx(10e-6)
    assert link_tier("nvlink4").alpha_s < link_tier("pcie5-x16").alpha_s
    assert (
        link_tier("ib-ndr").alpha_s < link_tier("roce-400g").alpha_s < link_tier("eth-100g").alpha_s
    )


# ml-engineering "Networking" seed: nccl-tests all_reduce_perf on one 8 x A100 node,
# (size bytes, time us, algbw GB/s, busbw GB/s) rows as printed.
NCCL_TESTS_A100_ROWS = [
    (33_554_432, 424.0, 79.14, 138.49),
    (134_217_728, 1327.6, 101.10, 176.92),
    (1_073_741_824, 8203.9, 130.88, 229.04),
    (17_179_869_184, 127997, 134.22, 234.89),
]


@pytest.mark.parametrize(("size", "time_us", "algbw", "busbw"), NCCL_TESTS_A100_ROWS)
def test_nccl_tests_table_and_nvlink3_efficiency(
    size: int, time_us: float, algbw: float, busbw: float
) -> None:
    measured = busbw_bytes_per_s("all_reduce", 8, size, time_us * 1e-6)
    assert measured / GB == pytest.approx(busbw, abs=0.02)
    assert measured / GB == pytest.approx(algbw * 1.75, abs=0.02)
    efficiency = measured / tier_peak_bytes_per_s("intra_node", "NVIDIA A100-SXM4-80GB")
    assert 0 < efficiency < 1


def test_largest_payload_reaches_78_percent_of_nvlink3() -> None:
    # The seed: "we get about 78% of the theoretical speed with 17GB payload" (234.89 / 300).
    size, time_us, _, _ = NCCL_TESTS_A100_ROWS[-1]
    busbw = busbw_bytes_per_s("all_reduce", 8, size, time_us * 1e-6)
    peak = tier_peak_bytes_per_s("intra_node", "NVIDIA A100-SXM4-80GB")
    assert peak == pytest.approx(300 * GB)
    assert round(busbw / peak, 2) == 0.78


@pytest.mark.parametrize(
    ("device", "intra", "inter"),
    [
        ("NVIDIA H100 80GB HBM3", "nvlink4", "ib-ndr"),
        ("NVIDIA A100-SXM4-80GB", "nvlink3", "ib-hdr"),
        # PCIe cards and AMD parts: no reference system whose datasheet names a NIC
        ("NVIDIA H100 PCIe", "pcie5-x16", None),
        ("AMD Instinct MI300X", "xgmi-mi300x", None),
        ("NVIDIA B200", "nvlink5", "ib-ndr"),
        ("NVIDIA H800", "nvlink4-h800", None),
        ("Tesla V100-SXM2-32GB", "nvlink2", None),
        ("NVIDIA L4", "pcie4-x16", None),
        ("AMD Instinct MI325X", "xgmi-mi325x", None),
        # unknown device and CPU: no tier at all (an explicit unknown, no PCIe Gen4 / 100 GbE)
        ("cpu", None, None),
        ("Mystery Accelerator 3000", None, None),
        (None, None, None),
    ],
)
def test_default_tiers_per_device(device: str | None, intra: str | None, inter: str | None) -> None:
    tiers = default_link_tiers(device)
    assert {t: link.name for t, link in tiers.items()} == {
        t: name for t, name in (("intra_node", intra), ("inter_node", inter)) if name is not None
    }
    models = default_link_models(device)
    assert set(models) == set(tiers)
    if intra is not None:
        assert models["intra_node"] == LINK_TIERS[intra].link_model()


def test_h800_and_mi325x_fabrics_match_their_datasheets() -> None:
    # H800 datasheet: NVLink 400 GB/s bidirectional -> 200 GB/s per direction (8 x 25 GB/s).
    assert link_tier("nvlink4-h800").unidirectional_bytes_per_s == pytest.approx(200 * GB)
    # MI325X datasheet: 7 Infinity Fabric links x 128 GB/s bidirectional -> 7 x 64 = 448 GB/s.
    assert link_tier("xgmi-mi325x").unidirectional_bytes_per_s == pytest.approx(448 * GB)


def test_detected_nvlink_overrides_the_default() -> None:
    # An H100 whose NVSwitch fabric has only 12 of 18 links up: 12 x 25 GB/s.
    links = DetectedLinks(nvlink_generation=4, nvlink_links_up=12, pcie_generation=5, pcie_width=16)
    tier = link_for_tier("intra_node", "NVIDIA H100 80GB HBM3", links)
    assert tier is not None and tier.kind == "nvlink"
    assert tier.unidirectional_bytes_per_s == pytest.approx(300 * GB)
    assert "detected" in tier.source


def test_detected_pcie_when_no_nvlink() -> None:
    links = DetectedLinks(pcie_generation=4, pcie_width=8)
    assert tier_peak_bytes_per_s("intra_node", None, links) == pytest.approx(31.5 * GB / 2)


def test_detected_nic_uses_the_fastest_active_port() -> None:
    links = DetectedLinks(nic_rates_bits_per_s=(200e9, 400e9), nic_kind="infiniband")
    tier = link_for_tier("inter_node", "NVIDIA H100 80GB HBM3", links)
    assert tier is not None and tier.kind == "infiniband"
    assert tier.unidirectional_bytes_per_s == pytest.approx(50 * GB)
    assert tier.alpha_s == pytest.approx(2e-6)


def test_nothing_detected_falls_back_to_the_device_default() -> None:
    tier = link_for_tier("inter_node", "NVIDIA A100-SXM4-80GB", DetectedLinks())
    assert tier is not None and tier.name == "ib-hdr"
    # nothing detected and nothing in a datasheet: unknown, not a guessed rate
    assert link_for_tier("inter_node", "NVIDIA L40S", DetectedLinks()) is None
    assert tier_peak_bytes_per_s("intra_node", None, DetectedLinks()) is None
    with pytest.raises(ValueError, match="tier"):
        link_for_tier("cross_rack", None)


def test_link_tier_validation() -> None:
    with pytest.raises(ValueError):
        LinkTier("x", "carrier-pigeon", 1.0, 0.0, "")
    with pytest.raises(ValueError):
        LinkTier("x", "pcie", 0.0, 0.0, "")
    with pytest.raises(ValueError, match="unknown link tier"):
        link_tier("nvlink9")
