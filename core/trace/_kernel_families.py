"""The kernel families: which library and kind of kernel a callee name belongs to, and what
it does (docs/analyze.md, "Kernel classes", has the table and the reasons).

Each family is a pattern on `_kernel_names.kernel_words` (the callee only: lower-case words
joined by ``_``, namespaces by ``.``). Patterns are word-aware: a word matches only where no
letter touches it on either side (digits may: ``s1688gemm``, ``conv2d``, ``rmsnorm2d``), so
``gemm`` is not found in ``fbgemm`` (FBGEMM's embedding tables) nor ``conv`` in
``type_convert``. The first family in `FAMILIES` whose pattern matches wins; the order below
is what resolves names that hold words of several kinds:

1. Inductor kernels are read by their prefix alone: the rest of an Inductor name lists the
   ATen ops fused into it (``triton_poi_fused_addmm_gelu_view`` is the pointwise epilogue of
   a matmul, not a matmul).
2. Communication: collectives, symmetric-memory and custom all-reduce kernels, NVSHMEM.
3. Kernels that name a GEMM, a convolution or attention but do no matrix math: FFT and
   Winograd transforms, offset computations, KV-cache writes, GEMM epilogues run as their own
   pass, MoE finalize, depthwise convolutions.
4. Attention, then GEMM (convolutions included), then the memory-bound kernels; anything
   else is ``other``.
"""

from __future__ import annotations

import re
from typing import NamedTuple

from mfuscope.core.vocabulary import KERNEL_CLASSES

__all__ = ["COMMUNICATION", "FAMILIES", "Family"]

GEMM, ATTENTION, ELEMENTWISE_NORM_REDUCE, OTHER = KERNEL_CLASSES
COMMUNICATION = "communication"  # not a compute class: the kernel is a transfer


class Family(NamedTuple):
    name: str
    kind: str  # a kernel class, or COMMUNICATION
    pattern: re.Pattern[str]
    pieces: tuple[str, ...]  # the alternatives `pattern` is made of
    # Plain text one of which every match of `pattern` holds (None: not checked): a cheap test
    # that skips the family's search for most names.
    gate: tuple[str, ...] | None


_COMMUNICATION_GATE = (
    "nccl",
    "rccl",
    "msccl",
    "reduce",
    "gather",
    "scatter",
    "all",
    "barrier",
    "nvshmem",
    "rocshmem",
    "userbuffers",
    "on_stream",
    "deep_ep",
    "pplx",
    "symmetric_memory",
    "intra_node_comm",
)


class _Words(NamedTuple):
    alternatives: tuple[str, ...]
    suffix: str

    def regex(self, alternatives: tuple[str, ...]) -> str:
        return r"(?<![a-z])(?:" + "|".join(alternatives) + r")(?![a-z])" + self.suffix


def _words(*alternatives: str, suffix: str = "") -> _Words:
    """Any of `alternatives` (regular expressions) as a whole word: no letter before or after;
    then `suffix`."""
    return _Words(alternatives, suffix)


def _family(
    name: str, kind: str, *pieces: str | _Words, gate: tuple[str, ...] | None = None
) -> Family:
    """The family matching any of `pieces`; its `pieces` list each alternative on its own
    (for tests), its pattern keeps each `_words` group as one (faster to search)."""
    grouped = [p if isinstance(p, str) else p.regex(p.alternatives) for p in pieces]
    single = [
        q
        for p in pieces
        for q in ((p,) if isinstance(p, str) else (p.regex((a,)) for a in p.alternatives))
    ]
    return Family(name, kind, re.compile("|".join(grouped)), tuple(single), gate)


_NORM = r"(?:rms|layer|group|batch|instance|weight|l2|ada_?layer)?_?norm(?:ali[sz]e|ali[sz]ation)?"

FAMILIES: tuple[Family, ...] = (
    # 1. PyTorch Inductor (torch/_inductor/codegen/triton.py names kernels triton_{poi,red,per,
    # for,tem}_<fused ops>_<n>; PyTorch 2.0 wrote triton__<n> with Triton's signature suffix,
    # e.g. triton__0d1d2d). Templates are matmuls, or flex attention.
    _family("Inductor template: flex attention", ATTENTION, r"^triton_tem_.*attention"),
    _family("Inductor template: matmul / convolution", GEMM, r"^triton_tem_"),
    _family(
        "Inductor pointwise / reduction / persistent reduction / foreach",
        ELEMENTWISE_NORM_REDUCE,
        r"^triton_(?:poi|red|per|for|\d)",
    ),
    # 2. Communication: NCCL / RCCL / MSCCL(++), collectives spelled in the callee (PyTorch
    # symmetric memory multimem_all_reduce_kernel / one_shot_all_reduce_kernel /
    # two_shot_all_reduce_kernel, torch intra_node_comm, TensorRT-LLM oneShotAllReduceKernel,
    # FlashInfer allreduce_fusion_kernel, NVSHMEM allToAllV), vLLM / SGLang / aiter custom
    # all-reduce (cross_device_reduce_1stage), NVSHMEM (nvshmem*, *_on_stream_kernel),
    # DeepEP, pplx, Transformer Engine userbuffers. NCCL's one-rank reduction
    # (`oneRankReduce`, src/device/onerank.cu: what a reduction with a pre-multiplied sum, such
    # as an average, runs at world size 1) is NCCL's kernel too.
    _family(
        "NCCL / RCCL / MSCCL",
        COMMUNICATION,
        _words(r"nccl", r"rccl", r"msccl(?:pp)?", r"one_rank_reduce"),
        gate=_COMMUNICATION_GATE,
    ),
    _family(
        "collective kernel",
        COMMUNICATION,
        _words(
            r"all_?reduce",
            r"all_?gather",
            r"reduce_?scatter",
            r"all_?to_?all(?:_?v)?",
            r"all2all",
            r"cross_device_reduce",
            r"multi_gpu_barrier",
        ),
        gate=_COMMUNICATION_GATE,
    ),
    _family(
        "NVSHMEM / DeepEP / pplx / userbuffers",
        COMMUNICATION,
        _words(r"nvshmem[ix]*", r"rocshmem", r"userbuffers"),
        r"on_stream_kernel",
        r"(?:^|\.)(?:deep_ep|pplx)\.(?!layout\.)",
        r"(?:^|\.)(?:symmetric_memory|intra_node_comm)\.",
        r"kuserbuffers",
        gate=_COMMUNICATION_GATE,
    ),
    # 3a. Convolution algorithms that are no GEMM in their own kernels: cuDNN's FFT
    # convolutions (fft2d_r2c_32x32, fft2d_c2r_32x32, flip_filter; also cuFFT's regular_fft)
    # and non-fused Winograd convolutions (cudnn::winograd_nonfused::winogradForwardData4x4)
    # transform data and filters around a batched (complex) GEMM, which is its own kernel
    # (ampere_gcgemm_*, volta_sgemm_*) and `gemm`. The transforms are memory-bound.
    _family(
        "FFT / Winograd transform",
        ELEMENTWISE_NORM_REDUCE,
        _words(r"i?fft\d*d?", r"r2c", r"c2r", r"c2c", r"flip_filter"),
        r"winograd_nonfused|generate_winograd_tiles",
        gate=("fft", "r2c", "c2r", "c2c", "flip_filter", "winograd"),
    ),
    # Helpers that name a GEMM or a convolution but do no math of either: offset and pointer
    # set-up (cask_cudnn_infer::computeOffsetsKernel, compute_gemm_pointers), torch.cuda._sleep.
    _family(
        "convolution / GEMM set-up helper",
        OTHER,
        _words(r"compute(?:_[a-z0-9]+)*_offsets_kernel", r"compute_gemm_pointers"),
        r"^at\.cuda\.spin_kernel$",
        gate=("offsets_kernel", "compute_gemm_pointers", "spin_kernel"),
    ),
    # 3b. Memory-bound although a GEMM or attention is named: KV-cache writes (vLLM
    # reshape_and_cache_flash_kernel / concat_and_cache_mla_kernel, SGLang store_kvcache,
    # FlashInfer AppendPagedKVCacheKernel), cuBLASLt epilogues run as their own pass
    # (epilogue::impl::globalKernel), the scatter that finishes an MoE matmul
    # (_finalize_matmul_scatter), weight repacking (gptq_marlin_repack), BLAS level 1.
    _family(
        "KV-cache write / GEMM epilogue pass / MoE finalize / repack / BLAS-1",
        ELEMENTWISE_NORM_REDUCE,
        _words(
            r"(?:reshape|concat|store|copy|write|append|swap)(?:_and)?(?:_paged)?_(?:kv_?)?cache",
            r"store_kv_?cache",
            r"epilogue",
            r"finalize",
            r"repack",
        ),
        r"^(?:scal|dot|axpy|nrm2|asum|swap|rot)_kernel",
        gate=("cache", "epilogue", "finalize", "repack", "_kernel"),
    ),
    # 3c. Convolutions that are no GEMM: depthwise (one filter per channel, nothing to reduce
    # over channels: ATen conv_depthwise2d_forward_kernel, Mamba's causal_conv1d) run on the
    # CUDA cores and are memory-bound.
    _family(
        "depthwise convolution",
        ELEMENTWISE_NORM_REDUCE,
        _words(r"conv_depthwise\d*d?", r"depthwise\w*", r"causal_conv1d\w*"),
        gate=("depthwise", "causal_conv1d"),
    ),
    # 4. Attention: FlashAttention-2/3 (flash_fwd_kernel, flash::FlashAttnFwdSm90,
    # pytorch_flash::), FlashMLA, xFormers / PyTorch memory-efficient (fmha_cutlassF_*),
    # cuDNN SDPA, TensorRT-LLM (fmha_v2, trtllm-gen fmhaSm100aKernel, XQA kernel_mha, mmha),
    # FlashInfer (BatchPrefillWithPagedKVCacheKernel, BatchDecode..., MergeStates), vLLM
    # (paged_attention_v2_kernel, kernel_unified_attention_2d), CK / aiter (FmhaFwdKernel,
    # fmha_fwd_hd128), Triton (_attn_fwd, lightllm-style _fwd_kernel / _fwd_kernel_stage1),
    # SageAttention (sage_fwd).
    _family(
        "attention",
        ATTENTION,
        _words(
            r"flash",
            r"flash_?attn\w*",
            r"f?mha",
            r"mmha",
            r"xqa",
            r"mla",
            r"attention",
            r"attn",
            r"sdpa",
            r"(?:batch|single)_(?:prefill|decode)",
            r"merge_(?:attn_)?states?",
            r"sage_(?:fwd|bwd|attn)",
        ),
        r"^(?:fwd|bwd)(?:_grouped)?_kernel(?:_stage\d)?$",
        gate=(
            "flash",
            "mha",
            "xqa",
            "mla",
            "attention",
            "attn",
            "sdpa",
            "prefill",
            "decode",
            "merge_",
            "sage_",
            "fwd_",
            "bwd_",
        ),
    ),
    # Sequence mixers that take attention's place: linear attention and the gated delta rule
    # (flash-linear-attention's chunk_gated_delta_rule_*, fused_recurrent_*, CUTLASS
    # FlatKernel...DeltaRule), Mamba's selective scan and chunked SSD (_chunk_scan_fwd_kernel).
    _family(
        "linear attention / state-space mixer",
        ATTENTION,
        _words(
            r"(?:gated_)?delta_rule",
            r"linear_attn",
            r"linear_attention",
            r"lightning_attn",
            r"kda",
            r"gla",
            r"selective_scan",
            r"selective_state_update",
            r"mamba\w*",
            r"chunk_(?:scan|state)",
            r"state_passing",
            r"ssd",
        ),
        gate=(
            "delta_rule",
            "linear_att",
            "lightning_attn",
            "kda",
            "gla",
            "selective_s",
            "mamba",
            "chunk_",
            "state_passing",
            "ssd",
        ),
    ),
    # 4b. Matrix math: cuBLAS / cuBLASLt (ampere_sgemm_*, sm90_xmma_gemm_*, nvjet_*, gemv*,
    # splitKreduce), CUTLASS (cutlass_80_tensorop_s1688gemm_*, GemmUniversal, cutlass3x_*),
    # trtllm-gen bmm_*, DeepGEMM, Marlin, Triton matmuls (matmul_ogs, fused_moe_kernel),
    # MAGMA, ROCm hipBLASLt / Tensile (Cijk_*), aiter's fused MoE (aiter::fmoe_*, mfma_moe1),
    # Composable Kernel (kernel_gemm_*,
    # GridwiseGemm), and convolutions as implicit GEMM (cuDNN scudnn / xmma fprop, dgrad,
    # wgrad; CUTLASS ImplicitGemmConvolution; MIOpen igemm_*, naive_conv, CK grouped_conv).
    _family(
        "GEMM / matmul",
        GEMM,
        _words(
            r"(?:[a-z]|gc|hc|zc|tiny)?gemm(?:k1)?",
            r"gemvx?",
            r"(?:b|add|baddb|scaled_|grouped_|int4_?)?mm",
            r"matmul",
            r"fused_moe",
            r"split_?k_?reduce",
            r"reduce_split_k",
        ),
        # A GEMM library's name marks a GEMM in the kernel's own name (cutlass_80_tensorop_*,
        # Cijk_*, marlin::Marlin), not in a namespace that holds other kernels too
        # (tensorrt_llm::kernels::cutlass_kernels::expandInputRowsKernel moves MoE rows).
        _words(
            r"xmma",
            r"nvjet",
            r"cutlass(?:3x)?",
            r"tensorop",
            r"wmma",
            r"cublas(?:_?lt)?",
            r"magma",
            r"cijk",
            r"marlin",
            r"fmoe",
            r"mfma",
            suffix=r"(?![^.]*\.)",
        ),
    ),
    _family(
        "convolution (implicit GEMM)",
        GEMM,
        _words(
            r"conv(?:olution|olve)?\d*d?",
            r"\d*d?conv",
            r"fprop",
            r"dgrad",
            r"wgrad",
            r"scudnn",
        ),
    ),
    # 4c. Memory-bound: elementwise, norms, softmax, reductions, scans and sorts, copies and
    # layout changes, embedding lookups (FBGEMM split_embedding_*), sparse-feature
    # bookkeeping, activations, rotary embeddings, quantisation, sampling, MoE routing,
    # optimizers. First by the words of the callee, then by library: what is left of ATen,
    # cub / rocPRIM / thrust, FBGEMM, cuDNN, vLLM, SGLang, FlashInfer, aiter, Transformer
    # Engine, TensorRT-LLM, MIOpen once the families above have taken their matrix and
    # attention kernels is memory-bound.
    _family(
        "elementwise / norm / reduction / data movement",
        ELEMENTWISE_NORM_REDUCE,
        _words(
            r"elementwise",
            r"element_wise",
            r"pointwise",
            r"vectorized",
            r"unrolled",
            r"unary",
            r"binary",
            r"fill",
            r"zeros?",
            r"memset",
            r"memcpy",
            r"copy",
            r"cast",
            r"convert",
            r"transpose",
            r"permute",
            r"reorder",
            r"cat",
            r"concat",
            r"stack",
            r"index",
            r"indices",
            r"index_select",
            r"gather",
            r"scatter",
            r"take",
            r"where",
            r"masked",
            r"embedding",
            r"embs?",
            r"dropout",
            r"pool(?:ing)?",
            r"upsample",
            r"interpolate",
            r"pad",
            r"im2col",
            r"col2im",
            r"im2d2_col",
            r"clamp",
            r"relu",
            r"gelu",
            r"silu",
            r"swiglu",
            r"geglu",
            r"sigmoid",
            r"tanh",
            r"activation",
            r"act_and_mul",
            r"and_mul",
            r"rotary",
            r"rope",
            r"soft_?max",
            _NORM,
            r"bn",
            r"ln",
            r"gamma_beta",
            r"moments",
            r"welford",
            r"reduce",
            r"reduction",
            r"sum",
            r"mean",
            r"amax",
            r"topk",
            r"top_k",
            r"sort",
            r"radix",
            r"scan",
            r"cumsum",
            r"histogram",
            r"unique",
            r"nonzero",
            r"compact",
            r"searchsorted",
            r"bucketize",
            r"sampling",
            r"sample",
            r"quant",
            r"quantize",
            r"dequant",
            r"dequantize",
            r"fp8",
            r"scale",
            r"adamw?",
            r"adagrad",
            r"sgd",
            r"lamb",
            r"optimizer",
            r"multi_tensor",
            r"arange",
            r"random",
            r"distribution",
            r"philox",
            r"loss",
            r"nll",
            r"cross_entropy",
            r"one_hot",
            r"flip",
            r"roll",
            r"tril",
            r"triu",
            r"repeat",
            r"expand",
            r"router",
            r"token_ids",
            r"routing",
            r"gating",
            r"moe_align",
            r"jagged",
            r"lengths",
            r"offsets?",
            r"segments",
            r"bounds_check",
            r"linearize",
            r"recat",
            r"bitmatrix",
            r"position",
            r"sub_tensor_op",
            r"compute_cuda_kernel",
        ),
        r"(?:^|\.)(?:at|c10|cub|at_cuda_detail|rocprim|thrust|hipcub|fbgemm_gpu|cudnn"
        r"|vllm|sglang|sgl_hip|sgl_kernel|flashinfer|aiter|ck_tile|transformer_engine"
        r"|tensorrt_llm|moe|apex|megatron)\.",
        r"^mi_open_",
    ),
)
