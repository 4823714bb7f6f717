"""The device table: dense peak FLOP/s per device and dtype, one vendor source per row.

Never the sparsity figure. Vendors print 2:4 structured-sparsity throughput next to (or instead of)
the dense figure, marked with an asterisk: that number is exactly 2x the dense one and no training
run uses it. Where a datasheet prints only the sparse figure, the dense figure is half of it and the
comment says so.

Dtype columns: ``fp32`` is the non-tensor-core FP32 rate (the vector rate on NVIDIA; AMD's matrix
FP32 on Instinct parts, which is what GEMMs run at), ``tf32`` the tensor-core rate FP32 matmuls use
when TF32 is allowed, ``bf16`` / ``fp16`` the tensor-core rate with FP32 accumulate, ``fp8`` the FP8
tensor-core rate. ``None`` means the device has no such mode. `memory_bytes_per_s` is the
datasheet's peak device-memory (HBM, or GDDR on PCIe cards) bandwidth, None where the row covers
parts that differ (e.g. A100 40GB vs 80GB).

Matching: a device name (as NVML, ``torch.cuda.get_device_name`` or a Kineto trace's
``deviceProperties`` report it) is lower-cased and split into tokens on anything that is not a
letter or digit. A row matches when every group in `match` has one of its tokens in the name and
no token of `exclude` is present. Rows are tried in order, so more specific rows come first.
"""

from __future__ import annotations

import msgspec

__all__ = ["DEVICES", "DeviceSpec"]

T = 1e12  # TFLOP/s -> FLOP/s
TB = 1e12  # TB/s -> bytes/s


class DeviceSpec(msgspec.Struct, frozen=True):
    key: str
    display_name: str
    fp32: float | None
    tf32: float | None
    bf16: float | None
    fp16: float | None
    fp8: float | None
    source: str
    intra_link: str  # default intra-node tier (links.LINK_TIERS name)
    # Default inter-node tier: the NIC per GPU of the vendor reference system whose datasheet
    # names it (DGX); None where no datasheet says which NIC a node has.
    inter_link: str | None
    match: tuple[tuple[str, ...], ...]
    exclude: tuple[str, ...] = ()
    aliases: tuple[str, ...] = ()
    memory_bytes_per_s: float | None = None

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
        "pcie4-x16", None,
        match=(("a100",), ("pcie",)),
        aliases=("a100-pcie",),
    ),
    # NVIDIA H100 Tensor Core GPU datasheet / Hopper architecture whitepaper, H100 SXM5:
    # FP32 66.9, TF32 494.7, BF16/FP16 989.4, FP8 1978.9 dense (datasheet prints the sparse
    # 989 / 1979 / 3958 with an asterisk).
    DeviceSpec(
        "h100-nvl", "NVIDIA H100 NVL", 60 * T, 417.5 * T, 835.5 * T, 835.5 * T, 1670.5 * T,
        "NVIDIA H100 NVL datasheet: TF32 835*, BF16 1671*, FP8 3341* with sparsity, halved",
        "nvlink4-bridge", None,
        match=(("h100",), ("nvl",)),
        aliases=("h100-nvl",),
        memory_bytes_per_s=3.9 * TB,  # H100 NVL datasheet: 94 GB HBM3, 3.9 TB/s
    ),
    DeviceSpec(
        "h100-pcie", "NVIDIA H100 PCIe", 51.2 * T, 378 * T, 756 * T, 756 * T, 1513 * T,
        "NVIDIA H100 PCIe datasheet: TF32 756*, BF16 1513*, FP8 3026* with sparsity, halved",
        "pcie5-x16", None,
        match=(("h100",), ("pcie",)),
        aliases=("h100-pcie",),
        memory_bytes_per_s=2.0 * TB,  # H100 PCIe datasheet: 80 GB HBM2e, 2 TB/s
    ),
    DeviceSpec(
        "h100-sxm", "NVIDIA H100 SXM5", 66.9 * T, 494.7 * T, 989.4 * T, 989.4 * T, 1978.9 * T,
        "NVIDIA H100 datasheet / Hopper whitepaper, SXM5 dense (1979 TFLOP/s BF16 is sparsity)",
        "nvlink4", "ib-ndr",
        match=(("h100",), ("sxm", "sxm5", "hbm3")),
        aliases=("h100-sxm", "h100-sxm5"),
        memory_bytes_per_s=3.35 * TB,  # H100 SXM datasheet: 80 GB HBM3, 3.35 TB/s
    ),
    # NVIDIA H200 datasheet: H200 SXM FP32 67, TF32 989*, BF16 1979*, FP8 3958* (sparse):
    # the same GH100 compute as H100 SXM; H200 NVL TF32 835*, BF16 1671*, FP8 3341*.
    DeviceSpec(
        "h200-nvl", "NVIDIA H200 NVL", 60 * T, 417.5 * T, 835.5 * T, 835.5 * T, 1670.5 * T,
        "NVIDIA H200 datasheet, H200 NVL: BF16 1671* with sparsity, halved",
        "nvlink4-bridge", None,
        match=(("h200",), ("nvl",)),
        aliases=("h200-nvl",),
        memory_bytes_per_s=4.8 * TB,  # H200 datasheet: 141 GB HBM3e, 4.8 TB/s
    ),
    DeviceSpec(
        "h200-sxm", "NVIDIA H200 SXM", 66.9 * T, 494.7 * T, 989.4 * T, 989.4 * T, 1978.9 * T,
        "NVIDIA H200 datasheet, H200 SXM: BF16 1979* with sparsity, halved",
        "nvlink4", "ib-ndr",
        match=(("h200",),),
        exclude=("nvl",),
        aliases=("h200", "h200-sxm"),
        memory_bytes_per_s=4.8 * TB,  # H200 datasheet: 141 GB HBM3e, 4.8 TB/s
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
        memory_bytes_per_s=8 * TB,  # GB200 NVL72 datasheet, per GPU: 186 GB HBM3e, 8 TB/s
    ),
    DeviceSpec(
        "b200", "NVIDIA B200", 75 * T, 1100 * T, 2250 * T, 2250 * T, 4500 * T,
        "NVIDIA HGX B200 datasheet, per GPU: BF16 4.5 PF* with sparsity, halved",
        "nvlink5", "ib-ndr",
        match=(("b200",),),
        exclude=("gb200",),
        aliases=("b200",),
        memory_bytes_per_s=7.7 * TB,  # HGX B200 datasheet, per GPU: 180 GB HBM3e, 7.7 TB/s
    ),
    # NVIDIA GH200 Grace Hopper Superchip datasheet
    # (https://resources.nvidia.com/en-us-grace-cpu/grace-hopper-superchip), GPU side: FP32 67,
    # TF32 494 (989*), BF16/FP16 990 (1979*), FP8 1979 (3958*) TFLOP/s, * = sparsity: the GH100
    # compute of the H100 SXM, so its whitepaper figures are used. 96 GB HBM3 at 4 TB/s (NVML:
    # "NVIDIA GH200 480GB", the 480 GB being the Grace LPDDR5X) or 144 GB HBM3e at 4.9 TB/s;
    # 18 NVLink4 links (900 GB/s bidirectional) to the NVLink Switch System.
    DeviceSpec(
        "gh200-hbm3e", "NVIDIA GH200 (144 GB HBM3e)", 66.9 * T, 494.7 * T, 989.4 * T,
        989.4 * T, 1978.9 * T,
        "NVIDIA GH200 Grace Hopper Superchip datasheet, HBM3e variant (dense; 1979* is sparsity)",
        "nvlink4", None,
        match=(("gh200",), ("144g", "144gb", "hbm3e")),
        aliases=("gh200-hbm3e", "gh200-144gb"),
        memory_bytes_per_s=4.9 * TB,
    ),
    DeviceSpec(
        "gh200", "NVIDIA GH200 (96 GB HBM3)", 66.9 * T, 494.7 * T, 989.4 * T, 989.4 * T,
        1978.9 * T,
        "NVIDIA GH200 Grace Hopper Superchip datasheet, HBM3 variant (dense; 1979* is sparsity)",
        "nvlink4", None,
        match=(("gh200",),),
        aliases=("gh200",),
        memory_bytes_per_s=4 * TB,
    ),
    # NVIDIA H800 Tensor Core GPU datasheet (nvidia.cn, H800 SXM5 / PCIe): the H100's compute
    # (SXM: TF32 989*, BF16 1979*, FP8 3958*; PCIe: TF32 756*, BF16 1513*, FP8 3026*, * =
    # sparsity) with NVLink cut to 400 GB/s bidirectional (8 NVLink4 links). SXM 80 GB HBM3
    # 3.35 TB/s, PCIe 80 GB HBM2e 2 TB/s. NVML calls the SXM part "NVIDIA H800".
    DeviceSpec(
        "h800-pcie", "NVIDIA H800 PCIe", 51.2 * T, 378 * T, 756 * T, 756 * T, 1513 * T,
        "NVIDIA H800 datasheet, PCIe: BF16 1513* with sparsity, halved",
        "nvlink4-h800", None,
        match=(("h800",), ("pcie",)),
        aliases=("h800-pcie",),
        memory_bytes_per_s=2.0 * TB,
    ),
    DeviceSpec(
        "h800-sxm", "NVIDIA H800 SXM5", 66.9 * T, 494.7 * T, 989.4 * T, 989.4 * T, 1978.9 * T,
        "NVIDIA H800 datasheet, SXM5: BF16 1979* with sparsity, halved",
        "nvlink4-h800", None,
        match=(("h800",),),
        aliases=("h800", "h800-sxm", "h800-sxm5"),
        memory_bytes_per_s=3.35 * TB,
    ),
    # NVIDIA L4 Tensor Core GPU datasheet (https://www.nvidia.com/en-us/data-center/l4/):
    # FP32 30.3, TF32 120*, BF16/FP16 242*, FP8 485* TFLOP/s (* = sparsity, dense = half);
    # 24 GB GDDR6 at 300 GB/s; PCIe Gen4 x16, no NVLink.
    DeviceSpec(
        "l4", "NVIDIA L4", 30.3 * T, 60 * T, 121 * T, 121 * T, 242.5 * T,
        "NVIDIA L4 datasheet (dense; 242 TFLOP/s BF16 is sparsity)",
        "pcie4-x16", None,
        match=(("l4",),),
        aliases=("l4",),
        memory_bytes_per_s=300e9,
    ),
    # NVIDIA Tesla V100 datasheet (https://www.nvidia.com/en-us/data-center/v100/): SXM2 FP32
    # 15.7, Tensor (FP16, FP32 accumulate) 125 TFLOP/s, NVLink 300 GB/s bidirectional (6 NVLink2
    # links); PCIe FP32 14, Tensor 112 TFLOP/s, PCIe Gen3 x16. Both HBM2 at 900 GB/s. Volta has
    # no BF16, TF32 or FP8 mode and no sparsity.
    DeviceSpec(
        "v100-pcie", "NVIDIA Tesla V100 PCIe", 14 * T, None, None, 112 * T, None,
        "NVIDIA V100 datasheet, PCIe",
        "pcie3-x16", None,
        match=(("v100",), ("pcie",)),
        aliases=("v100-pcie",),
        memory_bytes_per_s=900e9,
    ),
    DeviceSpec(
        "v100-sxm2", "NVIDIA Tesla V100 SXM2", 15.7 * T, None, None, 125 * T, None,
        "NVIDIA V100 datasheet, SXM2",
        "nvlink2", None,
        match=(("v100",), ("sxm2", "sxm")),
        aliases=("v100-sxm2", "v100-sxm"),
        memory_bytes_per_s=900e9,
    ),
    # AMD Instinct MI325X datasheet (https://www.amd.com/en/products/accelerators/instinct/mi300/
    # mi325x.html): FP32 matrix 163.4, TF32 653.7, FP16/BF16 1307.4, FP8 2614.9 TFLOP/s dense
    # (the MI300X's CDNA 3 compute; sparsity doubles them); 256 GB HBM3E at 6 TB/s; 7 Infinity
    # Fabric links of 128 GB/s bidirectional each to the platform's other 7 GPUs.
    DeviceSpec(
        "mi325x", "AMD Instinct MI325X", 163.4 * T, 653.7 * T, 1307.4 * T, 1307.4 * T,
        2614.9 * T,
        "AMD Instinct MI325X datasheet (dense; 2614.9 TFLOP/s FP16 is sparsity)",
        "xgmi-mi325x", None,
        match=(("mi325x",),),
        aliases=("mi325x",),
        memory_bytes_per_s=6 * TB,
    ),
    # AMD Instinct MI300X datasheet: FP32 matrix 163.4, TF32 653.7, FP16/BF16 1307.4,
    # FP8 2614.9 dense (sparsity doubles them).
    DeviceSpec(
        "mi300x", "AMD Instinct MI300X", 163.4 * T, 653.7 * T, 1307.4 * T, 1307.4 * T,
        2614.9 * T,
        "AMD Instinct MI300X datasheet (dense; 2614.9 TFLOP/s FP16 is sparsity)",
        "xgmi-mi300x", None,
        match=(("mi300x",),),
        aliases=("mi300x",),
        memory_bytes_per_s=5.3 * TB,  # MI300X datasheet: 192 GB HBM3, 5.3 TB/s
    ),
    # AMD Instinct MI250X datasheet: FP32 matrix 95.7, FP16/BF16 383 TFLOP/s per OAM module,
    # which holds two GCDs. ROCm (and therefore torch, NVML-like tools and traces) shows each
    # GCD as its own device, so the per-device peak is half the module's figure. No TF32/FP8.
    DeviceSpec(
        "mi250x", "AMD Instinct MI250X (one GCD)", 95.7 / 2 * T, None, 383 / 2 * T,
        383 / 2 * T, None,
        "AMD Instinct MI250X datasheet, per module / 2 GCDs (each GCD is one device)",
        "xgmi-mi250x", None,
        match=(("mi250x",),),
        aliases=("mi250x",),
    ),
    # NVIDIA L40S datasheet: FP32 91.6, TF32 183 (366*), BF16/FP16 362.05 (733*), FP8 733 (1466*).
    DeviceSpec(
        "l40s", "NVIDIA L40S", 91.6 * T, 183 * T, 362.05 * T, 362.05 * T, 733 * T,
        "NVIDIA L40S datasheet (dense; 733 TFLOP/s BF16 is sparsity)",
        "pcie4-x16", None,
        match=(("l40s",),),
        aliases=("l40s",),
        memory_bytes_per_s=864e9,  # L40S datasheet: 48 GB GDDR6, 864 GB/s
    ),
    # A10G is an AWS-only part (EC2 G5); NVIDIA publishes no datasheet for it. Figures from the
    # published A10 vs A10G comparison (Baseten, 2023: FP32 31.2, TF32 35, BF16/FP16 70 TFLOP/s
    # dense), consistent with GA102's FP32-accumulate tensor rate. Lower confidence than the
    # other rows: pass --peak-flops if you have a better figure.
    DeviceSpec(
        "a10g", "NVIDIA A10G", 31.2 * T, 35 * T, 70 * T, 70 * T, None,
        "A10 vs A10G comparison (Baseten 2023); no NVIDIA datasheet exists for this AWS part",
        "pcie4-x16", None,
        match=(("a10g",),),
        aliases=("a10g",),
    ),
)  # fmt: skip
