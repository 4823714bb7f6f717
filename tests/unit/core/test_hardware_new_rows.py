"""Peak table rows added from vendor datasheets, MIG slices, and devices left explicitly unknown.

Every expected figure is the datasheet's, halved by hand where the datasheet prints the sparse
(starred) number; the comment of each row names the datasheet.
"""

from __future__ import annotations

import pytest
from mfuscope.core.hardware import find_device, lookup_memory_bandwidth, lookup_peak
from mfuscope.core.mig import mig_slice

T = 1e12


@pytest.mark.parametrize(
    ("name", "key", "dtype", "tflops"),
    [
        # GH200 datasheet: BF16 1979* -> 989.5 dense; the GH100 figure (H100 whitepaper) is 989.4
        ("NVIDIA GH200 480GB", "gh200", "bf16", 989.4),
        ("NVIDIA GH200 480GB", "gh200", "fp8", 1978.9),
        ("NVIDIA GH200 144G HBM3e", "gh200-hbm3e", "bf16", 989.4),
        # H800 datasheet: SXM BF16 1979* -> 989.4; PCIe BF16 1513* -> 756
        ("NVIDIA H800", "h800-sxm", "bf16", 989.4),
        ("NVIDIA H800", "h800-sxm", "tf32", 494.7),
        ("NVIDIA H800 PCIe", "h800-pcie", "bf16", 756),
        # L4 datasheet: BF16 242* -> 121; FP8 485* -> 242.5; TF32 120* -> 60; FP32 30.3
        ("NVIDIA L4", "l4", "bf16", 121),
        ("NVIDIA L4", "l4", "fp8", 242.5),
        ("NVIDIA L4", "l4", "tf32", 60),
        ("NVIDIA L4", "l4", "fp32", 30.3),
        # V100 datasheet: SXM2 Tensor 125, FP32 15.7; PCIe Tensor 112, FP32 14 (no sparsity)
        ("Tesla V100-SXM2-32GB", "v100-sxm2", "fp16", 125),
        ("Tesla V100-SXM2-16GB", "v100-sxm2", "fp32", 15.7),
        ("Tesla V100-PCIE-16GB", "v100-pcie", "fp16", 112),
        # HGX B200 datasheet: BF16 4.5 PF* -> 2250; FP8 9 PF* -> 4500
        ("NVIDIA B200", "b200", "bf16", 2250),
        ("NVIDIA B200", "b200", "fp8", 4500),
        # MI325X datasheet: FP16/BF16 1307.4, FP8 2614.9, TF32 653.7, FP32 matrix 163.4 (dense)
        ("AMD Instinct MI325X", "mi325x", "bf16", 1307.4),
        ("AMD Instinct MI325X", "mi325x", "fp8", 2614.9),
        ("AMD Instinct MI325X", "mi325x", "tf32", 653.7),
        ("AMD Instinct MI325X", "mi325x", "fp32", 163.4),
    ],
)
def test_datasheet_rows(name: str, key: str, dtype: str, tflops: float) -> None:
    found = lookup_peak(name, dtype)
    assert (found.source, found.device_key) == ("spec", key)
    assert found.peak_flops == pytest.approx(tflops * T)


@pytest.mark.parametrize(
    ("name", "bytes_per_s"),
    [
        ("NVIDIA GH200 480GB", 4.0e12),  # 96 GB HBM3, 4 TB/s
        ("NVIDIA GH200 144G HBM3e", 4.9e12),  # 144 GB HBM3e, 4.9 TB/s
        ("NVIDIA H800", 3.35e12),
        ("NVIDIA L4", 300e9),  # GDDR6
        ("Tesla V100-SXM2-32GB", 900e9),
        ("NVIDIA B200", 7.7e12),
        ("AMD Instinct MI325X", 6e12),
        ("NVIDIA H100 80GB HBM3", 3.35e12),
    ],
)
def test_memory_bandwidth_rows(name: str, bytes_per_s: float) -> None:
    assert lookup_memory_bandwidth(name) == pytest.approx(bytes_per_s)


def test_volta_has_no_bf16_mode_and_says_so() -> None:
    found = lookup_peak("Tesla V100-SXM2-32GB", "bf16")
    assert (found.peak_flops, found.source) == (None, "unknown")
    assert "no bf16" in found.message


def test_h20_is_an_explicit_unknown_for_want_of_a_datasheet() -> None:
    found = lookup_peak("NVIDIA H20", "bf16")
    assert (found.peak_flops, found.source) == (None, "unknown")
    assert "no datasheet" in found.message
    assert find_device("NVIDIA H20") is None


def test_l4_does_not_swallow_l40s() -> None:
    assert find_device("NVIDIA L40S") is not None
    assert find_device("NVIDIA L40S").key == "l40s"  # type: ignore[union-attr]
    assert find_device("NVIDIA GB200").key == "gb200"  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("name", "key", "compute_share", "memory_share"),
    [
        # H100 80GB: 1g.10gb = 1/7 of the compute, 10/80 = 1/8 of the memory
        ("NVIDIA H100 80GB HBM3 MIG 1g.10gb", "h100-sxm", 1 / 7, 1 / 8),
        # 3g.40gb: 3/7 of the compute, 40/80 = 4/8 of the memory
        ("NVIDIA H100 80GB HBM3 MIG 3g.40gb", "h100-sxm", 3 / 7, 4 / 8),
        ("NVIDIA H100 80GB HBM3 MIG 7g.80gb", "h100-sxm", 7 / 7, 8 / 8),
        # A100 40GB: 1g.5gb = 1/7, 5/40 = 1/8; 4g.20gb = 4/7, 20/40 = 4/8
        ("NVIDIA A100-SXM4-40GB MIG 1g.5gb", "a100-sxm", 1 / 7, 1 / 8),
        ("NVIDIA A100-SXM4-40GB MIG 4g.20gb", "a100-sxm", 4 / 7, 4 / 8),
    ],
)
def test_mig_slices_get_their_share(
    name: str, key: str, compute_share: float, memory_share: float
) -> None:
    part = mig_slice(name)
    assert part is not None
    assert part.compute_share == pytest.approx(compute_share)
    assert part.memory_share == pytest.approx(memory_share)
    whole = lookup_peak(name.split(" MIG ")[0], "bf16").peak_flops or 0.0
    found = lookup_peak(name, "bf16")
    assert (found.source, found.device_key) == ("spec", key)
    assert found.peak_flops == pytest.approx(whole * compute_share)
    assert "MIG" in found.message


def test_mig_hbm_bandwidth_is_scaled_by_the_memory_share() -> None:
    # H100 SXM 3.35e12 B/s x 4/8 for a 3g.40gb slice = 1.675e12
    assert lookup_memory_bandwidth("NVIDIA H100 80GB HBM3 MIG 3g.40gb") == pytest.approx(1.675e12)
    # a GH200's "480GB" is CPU memory: 12 GB of 480 is no eighth, so the share is unknown
    assert lookup_memory_bandwidth("NVIDIA GH200 480GB MIG 1g.12gb") is None


def test_mig_without_a_readable_profile_is_unknown_never_the_whole_gpu() -> None:
    # NVML says MIG mode is on, the name carries no profile
    found = lookup_peak("NVIDIA H100 80GB HBM3", "bf16", mig=True)
    assert (found.peak_flops, found.source) == (None, "unknown")
    assert "MIG" in found.message
    assert lookup_peak("NVIDIA H100 80GB HBM3 MIG", "bf16").peak_flops is None
    assert mig_slice("NVIDIA A100 MIG 9g.5gb") is None  # there are only 7 compute slices
    assert lookup_memory_bandwidth("NVIDIA H100 80GB HBM3", mig=True) is None
