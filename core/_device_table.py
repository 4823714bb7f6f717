"""The device table: dense peak FLOP/s per device and dtype, one vendor source per row.

Never the sparsity figure. Vendors print 2:4 structured-sparsity throughput next to (or instead of)
the dense figure, marked with an asterisk: that number is exactly 2x the dense one and no training
run uses it. Where a datasheet prints only the sparse figure, the dense figure is half of it and the
comment says so.

Dtype columns: ``fp32`` is the non-tensor-core FP32 rate (the vector rate on NVIDIA; AMD's matrix
FP32 on Instinct parts, which is what GEMMs run at), ``tf32`` the tensor-core rate FP32 matmuls use
when TF32 is allowed, ``bf16`` / ``fp16`` the tensor-core rate with FP32 accumulate, ``fp8`` the FP8
tensor-core rate. ``None`` means the device has no such mode.

Matching: a device name (as NVML, ``torch.cuda.get_device_name`` or a Kineto trace's
``deviceProperties`` report it) is lower-cased and split into tokens on anything that is not a
letter or digit. A row matches when every group in `match` has one of its tokens in the name and
no token of `exclude` is present. Rows are tried in order, so more specific rows come first.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["DEVICES", "DeviceSpec"]

T = 1e12  # TFLOP/s -> FLOP/s


@dataclass(frozen=True)
class DeviceSpec:
    key: str
    display_name: str
    fp32: float | None
    tf32: float | None
    bf16: float | None
    fp16: float | None
    fp8: float | None
    source: str
    intra_link: str  # default intra-node tier (links.LINK_TIERS name)
    inter_link: str  # default inter-node tier: the reference design's NIC per GPU
    match: tuple[tuple[str, ...], ...]
    exclude: tuple[str, ...] = ()
    aliases: tuple[str, ...] = ()

    def peak(self, dtype: str) -> float | None:
        value: float | None = getattr(self, dtype)
        return value

    @property
    def family(self) -> tuple[str, ...]:
        """The first match group: the chip family token(s), used to explain ambiguous names."""
        return self.match[0]


DEVICES: tuple[DeviceSpec, ...] = (
    # NVIDIA A100 Tensor Core GPU datasheet (2021): FP32 19.5, TF32 156 (312*), BF16/FP16 312
    # (624*), * = with sparsity. SXM4 and PCIe parts have the same peaks; the PG509 board
    # (e.g. "NVIDIA A100-PG509-200" in the HTA trace) is an SXM4 module.
    DeviceSpec(
        "a100-sxm", "NVIDIA A100 SXM4", 19.5 * T, 156 * T, 312 * T, 312 * T, None,
        "NVIDIA A100 datasheet (dense; 624 TFLOP/s BF16 is sparsity)",
        "nvlink3", "ib-hdr",
        match=(("a100",), ("sxm", "sxm4", "pg509")),
        aliases=("a100", "a100-sxm4", "a100-sxm"),
    ),
    DeviceSpec(
        "a100-pcie", "NVIDIA A100 PCIe", 19.5 * T, 156 * T, 312 * T, 312 * T, None,
        "NVIDIA A100 datasheet (dense; 624 TFLOP/s BF16 is sparsity)",
        "pcie4-x16", "eth-100g",
        match=(("a100",), ("pcie",)),
        aliases=("a100-pcie",),
    ),
    # NVIDIA H100 Tensor Core GPU datasheet / Hopper architecture whitepaper, H100 SXM5:
    # FP32 66.9, TF32 494.7, BF16/FP16 989.4, FP8 1978.9 dense (datasheet prints the sparse
    # 989 / 1979 / 3958 with an asterisk).
    DeviceSpec(
        "h100-nvl", "NVIDIA H100 NVL", 60 * T, 417.5 * T, 835.5 * T, 835.5 * T, 1670.5 * T,
        "NVIDIA H100 NVL datasheet: TF32 835*, BF16 1671*, FP8 3341* with sparsity, halved",
        "nvlink4-bridge", "eth-100g",
        match=(("h100",), ("nvl",)),
        aliases=("h100-nvl",),
    ),
    DeviceSpec(
        "h100-pcie", "NVIDIA H100 PCIe", 51.2 * T, 378 * T, 756 * T, 756 * T, 1513 * T,
        "NVIDIA H100 PCIe datasheet: TF32 756*, BF16 1513*, FP8 3026* with sparsity, halved",
        "pcie5-x16", "eth-100g",
        match=(("h100",), ("pcie",)),
        aliases=("h100-pcie",),
    ),
    DeviceSpec(
        "h100-sxm", "NVIDIA H100 SXM5", 66.9 * T, 494.7 * T, 989.4 * T, 989.4 * T, 1978.9 * T,
        "NVIDIA H100 datasheet / Hopper whitepaper, SXM5 dense (1979 TFLOP/s BF16 is sparsity)",
        "nvlink4", "ib-ndr",
        match=(("h100",), ("sxm", "sxm5", "hbm3")),
        aliases=("h100-sxm", "h100-sxm5"),
    ),
    # NVIDIA H200 datasheet: H200 SXM FP32 67, TF32 989*, BF16 1979*, FP8 3958* (sparse):
    # the same GH100 compute as H100 SXM; H200 NVL TF32 835*, BF16 1671*, FP8 3341*.
    DeviceSpec(
        "h200-nvl", "NVIDIA H200 NVL", 60 * T, 417.5 * T, 835.5 * T, 835.5 * T, 1670.5 * T,
        "NVIDIA H200 datasheet, H200 NVL: BF16 1671* with sparsity, halved",
        "nvlink4-bridge", "eth-100g",
        match=(("h200",), ("nvl",)),
        aliases=("h200-nvl",),
    ),
    DeviceSpec(
        "h200-sxm", "NVIDIA H200 SXM", 66.9 * T, 494.7 * T, 989.4 * T, 989.4 * T, 1978.9 * T,
        "NVIDIA H200 datasheet, H200 SXM: BF16 1979* with sparsity, halved",
        "nvlink4", "ib-ndr",
        match=(("h200",),),
        exclude=("nvl",),
        aliases=("h200", "h200-sxm"),
    ),
    # NVIDIA HGX B200 / GB200 NVL72 datasheets, per GPU, printed with sparsity: HGX B200
    # FP8 9 PF*, FP16/BF16 4.5 PF*, TF32 2.2 PF*, FP32 75 TF; GB200 FP8 10 PF*, BF16 5 PF*,
    # TF32 2.5 PF*, FP32 80 TF. Dense = half of the starred figures.
    DeviceSpec(
        "gb200", "NVIDIA GB200 (per Blackwell GPU)", 80 * T, 1250 * T, 2500 * T, 2500 * T,
        5000 * T,
        "NVIDIA GB200 NVL72 datasheet, per GPU: BF16 5 PF* with sparsity, halved",
        "nvlink5", "ib-ndr",
        match=(("gb200",),),
        aliases=("gb200",),
    ),
    DeviceSpec(
        "b200", "NVIDIA B200", 75 * T, 1100 * T, 2250 * T, 2250 * T, 4500 * T,
        "NVIDIA HGX B200 datasheet, per GPU: BF16 4.5 PF* with sparsity, halved",
        "nvlink5", "ib-ndr",
        match=(("b200",),),
        aliases=("b200",),
    ),
    # AMD Instinct MI300X datasheet: FP32 matrix 163.4, TF32 653.7, FP16/BF16 1307.4,
    # FP8 2614.9 dense (sparsity doubles them).
    DeviceSpec(
        "mi300x", "AMD Instinct MI300X", 163.4 * T, 653.7 * T, 1307.4 * T, 1307.4 * T,
        2614.9 * T,
        "AMD Instinct MI300X datasheet (dense; 2614.9 TFLOP/s FP16 is sparsity)",
        "xgmi-mi300x", "eth-100g",
        match=(("mi300x",),),
        aliases=("mi300x",),
    ),
    # AMD Instinct MI250X datasheet: FP32 matrix 95.7, FP16/BF16 383 TFLOP/s per OAM module,
    # which holds two GCDs. ROCm (and therefore torch, NVML-like tools and traces) shows each
    # GCD as its own device, so the per-device peak is half the module's figure. No TF32/FP8.
    DeviceSpec(
        "mi250x", "AMD Instinct MI250X (one GCD)", 95.7 / 2 * T, None, 383 / 2 * T,
        383 / 2 * T, None,
        "AMD Instinct MI250X datasheet, per module / 2 GCDs (each GCD is one device)",
        "xgmi-mi250x", "eth-100g",
        match=(("mi250x",),),
        aliases=("mi250x",),
    ),
    # NVIDIA L40S datasheet: FP32 91.6, TF32 183 (366*), BF16/FP16 362.05 (733*), FP8 733 (1466*).
    DeviceSpec(
        "l40s", "NVIDIA L40S", 91.6 * T, 183 * T, 362.05 * T, 362.05 * T, 733 * T,
        "NVIDIA L40S datasheet (dense; 733 TFLOP/s BF16 is sparsity)",
        "pcie4-x16", "eth-100g",
        match=(("l40s",),),
        aliases=("l40s",),
    ),
    # A10G is an AWS-only part (EC2 G5); NVIDIA publishes no datasheet for it. Figures from the
    # published A10 vs A10G comparison (Baseten, 2023: FP32 31.2, TF32 35, BF16/FP16 70 TFLOP/s
    # dense), consistent with GA102's FP32-accumulate tensor rate. Lower confidence than the
    # other rows: pass --peak-flops if you have a better figure.
    DeviceSpec(
        "a10g", "NVIDIA A10G", 31.2 * T, 35 * T, 70 * T, 70 * T, None,
        "A10 vs A10G comparison (Baseten 2023); no NVIDIA datasheet exists for this AWS part",
        "pcie4-x16", "eth-100g",
        match=(("a10g",),),
        aliases=("a10g",),
    ),
)  # fmt: skip
