"""Kernel classes: the name table on every distinct kernel name of the real traces, and the
split of the compute / recompute buckets by class."""

from __future__ import annotations

import gzip
import json
import math
import re
from functools import cache
from pathlib import Path

import pytest
from mfuscope.core.trace import AnalysisOptions, analyze_trace, read_trace
from mfuscope.core.trace._kineto import is_comm_kernel
from mfuscope.core.trace.kernel_classes import KERNEL_CLASSES, classify_kernel

from tests.support.shared_data import A100_TRACE, MI300X_TRACE, require
from tests.support.trace_builder import TraceBuilder, realistic_trace

REAL = {
    "a100": A100_TRACE,
    "mi300x": MI300X_TRACE,
}
US = 1e-6

# What each kernel family is, written from the libraries' own naming (not from the table):
# (pattern on the name, class). Every distinct compute-kernel name of the real traces must
# match exactly one family.
FAMILIES: tuple[tuple[str, str], ...] = (
    # NVIDIA: cuBLAS/cuBLASLt, CUTLASS, cuDNN's convolutions (implicit GEMM)
    (r"^ampere_sgemm_", "gemm"),
    (r"^void cutlass::Kernel<cutlass_80_(tensorop|simt)_s\w*gemm", "gemm"),
    (
        r"^void cutlass_cudnn_(infer|train)::Kernel<cutlass_tensorop_s1688(fprop|dgrad|wgrad)",
        "gemm",
    ),
    (
        r"^void cutlass_cudnn_train::Kernel<cutlass_cudnn_train::reduction::kernel::ReduceSplitK",
        "gemm",
    ),
    (r"^_ZN19cutlass_cudnn_train6KernelINS_4conv6kernel23ImplicitGemmConvolution", "gemm"),
    (r"^sm80_xmma_(fprop|dgrad|wgrad)_implicit_gemm", "gemm"),
    (r"^cudnn_infer_ampere_scudnn_", "gemm"),
    (r"^void cublasLt::splitKreduce_kernel", "gemm"),
    (r"^void cudnn::cnn::reduce_wgrad_nchw_helper", "gemm"),  # the last pass of a conv wgrad
    # AMD: hipBLASLt/Tensile, MIOpen, Composable Kernel
    (r"^Cijk_A", "gemm"),
    (r"^igemm_(fwd|bwd|wrw)_gtcx3_", "gemm"),
    (r"^_ZN2ck16tensor_operation6device\w*(conv|gemm)", "gemm"),
    # memory-bound: ATen elementwise / reductions / norms / pooling / optimizer / copies
    (
        r"^void at::native::(\(anonymous namespace\)::)?(vectorized_|unrolled_)?elementwise_kernel",
        "elementwise_norm_reduce",
    ),
    (r"^void at::native::reduce_kernel<", "elementwise_norm_reduce"),
    (r"^void at::native::batch_norm_", "elementwise_norm_reduce"),
    (r"^void cudnn::bn_(fw|bw)_", "elementwise_norm_reduce"),
    (r"^void \(anonymous namespace\)::softmax_warp_", "elementwise_norm_reduce"),
    (r"^void at::native::\(anonymous namespace\)::max_pool_", "elementwise_norm_reduce"),
    (
        r"^void at::native::\(anonymous namespace\)::multi_tensor_apply_kernel",
        "elementwise_norm_reduce",
    ),
    (r"^void at::native::\(anonymous namespace\)::CatArrayBatchedCopy", "elementwise_norm_reduce"),
    (r"^void cudnn::ops::(nchwToNhwc|nhwcToNchw)Kernel", "elementwise_norm_reduce"),
    (r"^batched_transpose_\d+x\d+_half$", "elementwise_norm_reduce"),
    (r"^transpose_(CNHW2NCHW|NCHW2CNHW)_", "elementwise_norm_reduce"),
    (r"^SubTensorOpWith", "elementwise_norm_reduce"),  # MIOpen elementwise
    # a cuDNN helper computing offsets for a convolution: no class of its own
    (r"^void cask_cudnn_infer::computeOffsetsKernel", "other"),
)


@cache
def compute_kernel_names(which: str) -> tuple[str, ...]:
    with gzip.open(require(REAL[which])) as handle:
        events = json.load(handle)["traceEvents"]
    names = {e["name"] for e in events if e.get("cat") == "kernel"}
    return tuple(sorted(n for n in names if not is_comm_kernel(n)))


@pytest.mark.parametrize("which", sorted(REAL))
def test_every_kernel_name_of_the_real_traces(which: str) -> None:
    names = compute_kernel_names(which)
    assert len(names) > 40
    for name in names:
        families = [cls for pattern, cls in FAMILIES if re.search(pattern, name)]
        assert len(families) == 1, (name, families)
        assert classify_kernel(name) == families[0], name


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        # FlashAttention-2 / -3, PyTorch memory-efficient attention, cuDNN SDPA, flex attention
        (
            "void flash_fwd_kernel<Flash_fwd_kernel_traits<128, 128, 64, 4, false>, true>",
            "attention",
        ),
        ("void flash::flash_fwd_splitkv_kernel<Flash_fwd_kernel_traits<64, 64, 256>>", "attention"),
        (
            "fmha_cutlassF_bf16_aligned_64x64_rf_sm80(PyTorchMemEffAttention::AttentionKernel)",
            "attention",
        ),
        ("cudnn_generated_fort_native_sdpa_sm90_knob_7_64x128x64_4x1x1_kernel0_0", "attention"),
        ("triton_tem_fused_flex_attention_0", "attention"),
        ("_attn_fwd", "attention"),
        # Hopper cuBLAS / CUTLASS, Inductor matmul templates
        ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1", "gemm"),
        ("nvjet_tst_192x192_64x4_2x1_v_bz_coopB_NNT", "gemm"),
        ("triton_tem_fused_mm_0", "gemm"),
        # Inductor pointwise / reductions, norms, optimizers
        ("triton_poi_fused_add_mul_0", "elementwise_norm_reduce"),
        ("triton_red_fused__to_copy_mean_pow_1", "elementwise_norm_reduce"),
        ("triton_per_fused_native_layer_norm_2", "elementwise_norm_reduce"),
        (
            "void at::native::(anonymous namespace)::vectorized_layer_norm_kernel<c10::BFloat16>",
            "elementwise_norm_reduce",
        ),
        (
            "void at::native::(anonymous namespace)::cunn_SoftMaxForward<4, float>",
            "elementwise_norm_reduce",
        ),
        (
            "void at::native::multi_tensor_apply_kernel<FusedAdamMathFunctor>",
            "elementwise_norm_reduce",
        ),
        ("void rms_norm_kernel<c10::BFloat16>", "elementwise_norm_reduce"),
        # the synthetic builder's default kernel
        ("void gemm_kernel<float>(float*, float const*)", "gemm"),
        ("my_custom_kernel", "other"),
    ],
)
def test_names_of_other_stacks(name: str, expected: str) -> None:
    assert classify_kernel(name) == expected


def test_synthetic_trace_kernels_are_gemm() -> None:
    trace, _ = realistic_trace(2000, kernels_per_step=200)
    names = {e["name"] for e in trace["traceEvents"] if e.get("cat") == "kernel"}
    compute = {n for n in names if not is_comm_kernel(n)}
    assert compute and {classify_kernel(n) for n in compute} == {"gemm"}


def test_classes_share_overlapping_instants_and_sum_to_the_bucket(tmp_path: Path) -> None:
    b = TraceBuilder(world_size=1)
    b.profiler_step(1, 0.0, 50.0)
    b.kernel(100.0, 40.0, stream=7, launch_at=1.0)  # gemm [100, 140)
    b.kernel(120.0, 40.0, stream=8, launch_at=2.0, name="void at::native::reduce_kernel<512>")
    b.kernel(170.0, 10.0, stream=7, launch_at=3.0, name="flash_fwd_kernel")
    b.kernel(185.0, 5.0, stream=7, launch_at=4.0, name="mystery")
    path = tmp_path / "t.json"
    path.write_text(json.dumps(b.build()))
    for result in (analyze_trace(b.build()), analyze_trace(read_trace(path))):
        (step,) = result.steps
        classes = step.compute_classes
        assert classes is not None
        # [120, 140) is shared by gemm and the reduction: 10 µs each
        assert classes.gemm == pytest.approx(30 * US)
        assert classes.elementwise_norm_reduce == pytest.approx(30 * US)
        assert classes.attention == pytest.approx(10 * US)
        assert classes.other == pytest.approx(5 * US)
        assert math.fsum(classes.as_dict().values()) == pytest.approx(step.compute_s)


def test_recompute_is_split_too_and_cpu_timelines_have_no_classes(tmp_path: Path) -> None:
    b = TraceBuilder(world_size=1)
    b.profiler_step(1, 0.0, 50.0)
    b.annotation("mfuscope::recompute", 10.0, 20.0)  # the recompute range of the launches
    b.kernel(100.0, 40.0, launch_at=1.0)
    b.kernel(130.0, 30.0, stream=8, launch_at=12.0, name="triton_poi_fused_relu_0", recompute=True)
    (step,) = analyze_trace(b.build(), AnalysisOptions()).steps
    assert step.recompute_s == pytest.approx(20 * US)  # [140, 160): the part not under compute
    assert step.recompute_classes is not None
    assert step.recompute_classes.elementwise_norm_reduce == pytest.approx(20 * US)
    cpu = TraceBuilder(world_size=1, gpu=False)
    cpu.profiler_step(1, 0.0, 50.0)
    cpu.cpu_op("aten::mm", 1.0, 40.0)
    (host_step,) = analyze_trace(cpu.build()).steps
    assert host_step.compute_classes is None and host_step.recompute_classes is None
    assert set(KERNEL_CLASSES) == {"gemm", "attention", "elementwise_norm_reduce", "other"}


def test_recompute_of_several_classes_leaves_out_what_compute_covers() -> None:
    b = TraceBuilder(world_size=1)
    b.profiler_step(1, 0.0, 50.0)
    b.annotation("mfuscope::recompute", 10.0, 20.0)
    b.kernel(100.0, 40.0, launch_at=1.0)  # compute [100, 140)
    b.kernel(120.0, 40.0, stream=8, launch_at=12.0, recompute=True)  # gemm, [140, 160) left
    b.kernel(150.0, 20.0, stream=9, launch_at=13.0, name="softmax_warp_forward", recompute=True)
    (step,) = analyze_trace(b.build()).steps
    classes = step.recompute_classes
    assert classes is not None and step.recompute_s == pytest.approx(30 * US)  # [140, 170)
    # [140, 150) gemm alone, [150, 160) shared, [160, 170) softmax alone
    assert classes.gemm == pytest.approx(15 * US)
    assert classes.elementwise_norm_reduce == pytest.approx(15 * US)
    assert step.compute_classes is not None and step.compute_classes.gemm == pytest.approx(40 * US)
