"""Kernel classes: which kind of work a compute kernel does, from its name alone.

The compute (and recompute) bucket is split into four classes (docs/analyze.md, "Kernel
classes"), so the MFU waterfall can show the slice lost to unfused, memory-bound kernels
(`mfu.waterfall`'s ``f_elementwise``):

- ``gemm``: matrix multiplies on the tensor/matrix cores, convolutions run as implicit GEMM
  included: cuBLAS / cuBLASLt (``gemm``, ``nvjet``, ``cublas``), CUTLASS and cuDNN's
  CUTLASS/xmma kernels (``cutlass``, ``xmma``, ``sm80_``/``sm90_`` names, ``fprop``/``dgrad``/
  ``wgrad``, ``scudnn``), ROCm hipBLASLt/Tensile (``Cijk_``), MIOpen (``igemm``) and
  Composable Kernel (``ck::tensor_operation`` convolutions), Triton matmul templates
  (``triton_tem_``);
- ``attention``: fused attention kernels: FlashAttention-2/3 (``flash``), PyTorch's
  memory-efficient attention (``fmha``, ``efficient_attention``), cuDNN SDPA (``sdpa``),
  Triton/flex attention (``attention``, ``attn``);
- ``elementwise_norm_reduce``: the memory-bound kernels fusion removes: ATen elementwise and
  vectorized kernels, reductions, batch/layer/RMS norm, softmax, pooling, optimizer kernels
  (``multi_tensor_apply``, Adam), layout transposes and copies, Inductor's pointwise /
  reduction Triton kernels (``triton_poi_``, ``triton_red_``, ``triton_per_``);
- ``other``: anything else (including helpers such as cuDNN's ``computeOffsetsKernel``).

The first class with a pattern the lower-cased name holds wins, in the order above except
that ``attention`` is tried first (FlashAttention kernels hold ``gemm``-like words). The
table is tested on every distinct kernel name of the real traces the project is checked on.
"""

from __future__ import annotations

from functools import lru_cache

from mfuscope.core.vocabulary import KERNEL_CLASSES

__all__ = [
    "ATTENTION",
    "ELEMENTWISE_NORM_REDUCE",
    "GEMM",
    "KERNEL_CLASSES",
    "OTHER",
    "class_code",
    "classify_kernel",
]

# The vocabulary is the wire schema's; codes are positions in it (the engine keeps one small
# integer per kernel).
GEMM, ATTENTION, ELEMENTWISE_NORM_REDUCE, OTHER = KERNEL_CLASSES

# (class, lower-case substrings), tried in order.
_TABLE: tuple[tuple[str, tuple[str, ...]], ...] = (
    (
        ATTENTION,
        ("flash", "fmha", "attention", "attn", "sdpa", "mha_fwd", "mha_bwd"),
    ),
    (
        GEMM,
        (
            "gemm",
            "cutlass",
            "xmma",
            "cublas",
            "nvjet",
            "cijk_",
            "scudnn",
            "fprop",
            "dgrad",
            "wgrad",
            "conv",
            "matmul",
            "triton_tem_",
        ),
    ),
    (
        ELEMENTWISE_NORM_REDUCE,
        (
            "elementwise",
            "reduce",
            "norm",
            "bn_fw",
            "bn_bw",
            "softmax",
            "pool",
            "multi_tensor_apply",
            "adam",
            "triton_poi_",
            "triton_red_",
            "triton_per_",
            "transpose",
            "nchwtonhwc",
            "nhwctonchw",
            "copy",
            "fill",
            "subtensorop",
            "index",
            "gather",
            "scatter",
            "cat_",
            "catarray",
            "dropout",
        ),
    ),
)
_CODE = {name: code for code, name in enumerate(KERNEL_CLASSES)}


@lru_cache(maxsize=65536)
def classify_kernel(name: str) -> str:
    """The class of a compute kernel called `name` (see the module docstring)."""
    lowered = name.lower()
    for kernel_class, patterns in _TABLE:
        if any(pattern in lowered for pattern in patterns):
            return kernel_class
    return OTHER


def class_code(name: str | None) -> int:
    """`classify_kernel` as a position in `KERNEL_CLASSES` (None: ``other``)."""
    return _CODE[OTHER if name is None else classify_kernel(name)]
