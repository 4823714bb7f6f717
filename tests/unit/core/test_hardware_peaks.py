"""Peak FLOP/s table and lookup: dense vendor figures, explicit unknowns, no silent fallback."""

from __future__ import annotations

import gzip
import json

import pytest
from hypothesis import given
from hypothesis import strategies as st
from mfuscope.core._device_table import DEVICES
from mfuscope.core.hardware import (
    DTYPES,
    PeakLookup,
    find_device,
    known_devices,
    lookup_peak,
    normalize_dtype,
    resolve_peak,
    user_peak,
)

from tests.support.shared_data import TRACES, require

T = 1e12


@pytest.mark.parametrize(
    ("name", "dtype", "key", "tflops"),
    [
        # NVIDIA H100 datasheet: 989.4 dense BF16 (the 1979 on the sheet is with sparsity)
        ("NVIDIA H100 80GB HBM3", "bf16", "h100-sxm", 989.4),
        ("NVIDIA H100 80GB HBM3", "tf32", "h100-sxm", 494.7),
        ("NVIDIA H100 80GB HBM3", "fp8", "h100-sxm", 1978.9),
        ("NVIDIA H100 PCIe", "bf16", "h100-pcie", 756),
        ("NVIDIA H100 NVL", "bf16", "h100-nvl", 835.5),
        # NVIDIA A100 datasheet: 312 dense BF16 / FP16, 156 TF32, 19.5 FP32
        ("NVIDIA A100-SXM4-80GB", "bf16", "a100-sxm", 312),
        ("NVIDIA A100-SXM4-40GB", "fp16", "a100-sxm", 312),
        ("NVIDIA A100-PCIE-40GB", "tf32", "a100-pcie", 156),
        ("NVIDIA A100 80GB PCIe", "fp32", "a100-pcie", 19.5),
        ("NVIDIA H200", "bf16", "h200-sxm", 989.4),
        ("NVIDIA H200 NVL", "bf16", "h200-nvl", 835.5),
        ("NVIDIA B200", "bf16", "b200", 2250),
        ("NVIDIA GB200", "fp8", "gb200", 5000),
        # AMD MI300X datasheet: 1307.4 dense FP16/BF16
        ("AMD Instinct MI300X", "bf16", "mi300x", 1307.4),
        # MI250X: 383 per module, each of its two GCDs is one device
        ("AMD Instinct MI250X", "bf16", "mi250x", 191.5),
        ("NVIDIA L40S", "bf16", "l40s", 362.05),
        ("NVIDIA A10G", "bf16", "a10g", 70),
        # table keys and aliases work as --device values
        ("h100-sxm", "bfloat16", "h100-sxm", 989.4),
        ("A100", "torch.bfloat16", "a100-sxm", 312),
    ],
)
def test_spec_peaks_are_the_dense_vendor_figures(
    name: str, dtype: str, key: str, tflops: float
) -> None:
    found = lookup_peak(name, dtype)
    assert found.source == "spec"
    assert found.device_key == key
    assert found.peak_flops == pytest.approx(tflops * T)


def test_no_row_carries_a_sparsity_figure() -> None:
    # Sparsity doubles the dense figure; the H100 and A100 sparse BF16 peaks are 1979 and 624.
    assert lookup_peak("NVIDIA H100 80GB HBM3", "bf16").peak_flops != pytest.approx(1979 * T)
    assert lookup_peak("NVIDIA A100-SXM4-80GB", "bf16").peak_flops != pytest.approx(624 * T)
    for spec in DEVICES:
        assert spec.source, spec.key
        # Sparse columns are exactly 2x dense; dense bf16 is ~2x tf32 on every tensor-core part.
        if spec.tf32 is not None and spec.bf16 is not None:
            assert spec.bf16 == pytest.approx(2 * spec.tf32, rel=0.03), spec.key


def test_tf32_peak_is_not_the_bf16_peak() -> None:
    bf16 = lookup_peak("NVIDIA H100 80GB HBM3", "bf16").peak_flops
    tf32 = lookup_peak("NVIDIA H100 80GB HBM3", "tf32").peak_flops
    assert bf16 is not None and tf32 is not None
    assert bf16 == pytest.approx(2 * tf32)


def test_unknown_gpu_is_explicit_and_says_how_to_pass_the_peak() -> None:
    found = lookup_peak("NVIDIA Quantum GX9000", "bf16")
    assert found.peak_flops is None
    assert found.source == "unknown"
    assert found.device_key is None
    assert "--peak-flops" in found.message
    assert "peak_flops=" in found.message  # the agent option


def test_ambiguous_variant_is_unknown_not_the_sxm_figure() -> None:
    # A bare "H100" could be SXM (989.4), PCIe (756) or NVL (835.5): no guess.
    found = lookup_peak("NVIDIA H100", "bf16")
    assert found.source == "unknown"
    assert found.peak_flops is None
    for key in ("h100-sxm", "h100-pcie", "h100-nvl"):
        assert key in found.message


def test_dtype_without_a_tensor_mode_is_unknown() -> None:
    found = lookup_peak("NVIDIA A100-SXM4-80GB", "fp8")  # Ampere has no FP8 tensor cores
    assert found.source == "unknown"
    assert found.device_key == "a100-sxm"
    assert "fp8" in found.message


def test_cpu_is_never_tabulated() -> None:
    found = lookup_peak("cpu", "fp32")
    assert (found.source, found.device_key, found.peak_flops) == ("unknown", "cpu", None)
    assert "measure_cpu_peak_flops" in found.message


@pytest.mark.parametrize(
    ("folder", "key"),
    [("hta_resnet_ddp_2xA100", "a100-sxm"), ("tracelens_resnet_actckpt_8xMI300X", "mi300x")],
)
def test_device_names_from_real_traces_resolve(folder: str, key: str) -> None:
    # Golden: the deviceProperties names the Kineto traces in ../shared/traces carry
    # ("NVIDIA A100-PG509-200", "AMD Instinct MI300X"). The array sits at the top of both files,
    # so decode just it rather than the whole 10-17 MB trace.
    (path,) = require(TRACES / folder).glob("*.json.gz")
    with gzip.open(path, "rt") as handle:
        head = handle.read(1 << 16)
    start = head.index("[", head.index('"deviceProperties"'))
    devices, _ = json.JSONDecoder().raw_decode(head, start)
    names = {d["name"] for d in devices}
    assert len(names) == 1
    found = lookup_peak(names.pop(), "bf16")
    assert found.source == "spec"
    assert found.device_key == key


@pytest.mark.parametrize(
    ("spelling", "dtype"),
    [("bfloat16", "bf16"), ("torch.float16", "fp16"), ("half", "fp16"), ("FP32", "fp32")],
)
def test_normalize_dtype(spelling: str, dtype: str) -> None:
    assert normalize_dtype(spelling) == dtype


def test_unreadable_dtype_is_a_value_error() -> None:
    with pytest.raises(ValueError, match="unknown dtype"):
        lookup_peak("NVIDIA H100 80GB HBM3", "int4")


def test_user_peak_wins_over_the_table() -> None:
    found = resolve_peak("NVIDIA H100 80GB HBM3", "bf16", peak_flops=800e12)
    assert (found.source, found.peak_flops, found.device_key) == ("user", 800e12, "h100-sxm")
    assert resolve_peak("NVIDIA H100 80GB HBM3", "bf16").source == "spec"
    assert resolve_peak(None, "bf16").source == "unknown"
    with pytest.raises(ValueError):
        user_peak(0.0)


def test_peak_lookup_rejects_inconsistent_states() -> None:
    with pytest.raises(ValueError):
        PeakLookup(None, "spec", "x", "a spec result needs a figure")
    with pytest.raises(ValueError):
        PeakLookup(1e12, "unknown", None, "an unknown result has no figure")
    with pytest.raises(ValueError):
        PeakLookup(1e12, "datasheet", None, "not in the vocabulary")


def test_every_row_is_reachable_by_its_key() -> None:
    for key in known_devices():
        spec = find_device(key)
        assert spec is not None and spec.key == key


# Names made of tokens no row knows: the lookup must say unknown, never borrow a figure.
_unrelated = st.text(alphabet="qwxyz-_ 0123456789", min_size=1, max_size=30)


@given(_unrelated, st.sampled_from(DTYPES))
def test_unrecognised_names_never_get_a_figure(name: str, dtype: str) -> None:
    found = lookup_peak(f"Vendor {name}", dtype)
    assert found.source == "unknown"
    assert found.peak_flops is None
