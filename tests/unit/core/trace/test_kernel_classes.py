"""Kernel classes: the name table on every distinct kernel name of the real traces and on a
committed list of real names per family, communication kernels beyond NCCL, and the split of
the compute / recompute buckets by class."""

from __future__ import annotations

import gzip
import json
import math
import re
from functools import cache
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from mfuscope.core.trace import AnalysisOptions, analyze_trace, read_trace
from mfuscope.core.trace._kernel_families import FAMILIES as TABLE
from mfuscope.core.trace._kernel_families import Family
from mfuscope.core.trace._kineto import COMM_KERNEL_SUBSTRINGS, is_comm_kernel
from mfuscope.core.trace.kernel_classes import (
    KERNEL_CLASSES,
    classify_kernel,
    is_communication_kernel,
    kernel_family,
)
from mfuscope.core.vocabulary import AXIS_UNKNOWN, TIER_UNKNOWN

from tests.support.shared_data import A100_TRACE, MI300X_TRACE, require
from tests.support.trace_builder import TraceBuilder, realistic_trace

REAL = {
    "a100": A100_TRACE,
    "mi300x": MI300X_TRACE,
}
US = 1e-6
# Real names per family with their class and where each was seen (tests/data/README.md).
COMMITTED = Path(__file__).resolve().parents[3] / "data" / "kernel_names.tsv"

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


def _committed() -> list[tuple[str, str, str]]:
    rows = []
    for line in COMMITTED.read_text(encoding="utf-8").splitlines():
        if line and not line.startswith("#"):
            expected, source, name = line.split("\t")
            rows.append((expected, source, name))
    return rows


def test_every_committed_name_has_its_class() -> None:
    rows = _committed()
    kinds = {expected for expected, _, _ in rows}
    assert kinds == {*KERNEL_CLASSES, "communication"} and len(rows) > 400
    wrong = []
    for expected, source, name in rows:
        if expected == "communication":
            got = "communication" if is_communication_kernel(name) else classify_kernel(name)
        else:
            got = classify_kernel(name)
            assert not is_communication_kernel(name), name
        if got != expected:
            wrong.append((expected, got, kernel_family(name)[0], source, name[:120]))
    assert not wrong, "\n".join(map(str, wrong))


def test_every_communication_name_is_kept_decoded_by_the_selection() -> None:
    # The C selection decodes only kernels whose name holds one of these; a communication
    # kernel it left out would be compute.
    for expected, _, name in _committed():
        if expected == "communication":
            assert any(part in name.lower() for part in COMM_KERNEL_SUBSTRINGS), name


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        # words, not substrings: FBGEMM is no GEMM, a type conversion no convolution, the
        # FlashInfer library no FlashAttention, Inductor's fused-op list no matmul
        (
            "void fbgemm_gpu::permute_2D_data_kernel<false, int, int, decltype(nullptr)>(int)",
            "elementwise_norm_reduce",
        ),
        (
            "void vllm::rms_norm_kernel<float, vllm::_typeConvert<float> >(float*)",
            "elementwise_norm_reduce",
        ),
        ("void flashinfer::norm::RMSNormKernel<8u, __half>(__half*)", "elementwise_norm_reduce"),
        ("triton_poi_fused__scaled_dot_product_flash_attention_cat_3", "elementwise_norm_reduce"),
        ("triton_red_fused_addmm_native_layer_norm_5", "elementwise_norm_reduce"),
        # no matrix math behind a GEMM-ish name
        (
            "void cudnn::gemm::computeOffsetsKernel<false>(cudnn::gemm::ComputeOffsetsParams)",
            "other",
        ),
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


_GATED = [(f, piece) for f in TABLE if f.gate is not None for piece in f.pieces]


@pytest.mark.parametrize(("family", "piece"), _GATED, ids=[p for _, p in _GATED])
@settings(max_examples=25, deadline=None)
@given(data=st.data())
def test_a_family_gate_lets_every_match_through(
    family: Family, piece: str, data: st.DataObject
) -> None:
    """The gate only skips a search that could not match: every text a piece matches holds
    one of the gate's words."""
    text = data.draw(st.from_regex(piece))
    assert family.gate is not None and any(part in text for part in family.gate), text


def test_communication_beyond_nccl_is_exposed_with_the_group_unknown(tmp_path: Path) -> None:
    """A symmetric-memory all-reduce is communication: exposed when nothing computes beside
    it, on the unknown axis and tier (the trace names no group), and a collective record."""
    b = TraceBuilder(world_size=2)
    b.profiler_step(1, 0.0, 50.0)
    b.kernel(100.0, 40.0, launch_at=1.0)  # compute [100, 140)
    b.comm_kernel(
        130.0,
        30.0,
        launch_at=2.0,
        metadata="none",
        kernel_name="void (anonymous namespace)::multimem_all_reduce_kernel<c10::BFloat16, 16>"
        "(c10::BFloat16*, unsigned long, unsigned int**, unsigned long, unsigned long)",
    )
    path = tmp_path / "t.json"
    path.write_text(json.dumps(b.build()))
    for result in (analyze_trace(b.build()), analyze_trace(read_trace(path))):
        (step,) = result.steps
        assert step.compute_s == pytest.approx(40 * US)
        (exposed,) = step.exposed_comm
        assert (exposed.axis, exposed.tier) == (AXIS_UNKNOWN, TIER_UNKNOWN)
        assert exposed.seconds == pytest.approx(20 * US)  # [140, 160)
        assert step.overlapped_comm_s == pytest.approx(10 * US)
        (record,) = step.collectives
        assert (record.op, record.group_size, record.bytes) == ("all_reduce", None, None)
        assert step.compute_classes is not None and step.compute_classes.other == 0.0


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
