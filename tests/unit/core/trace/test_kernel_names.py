"""A kernel's callee out of the name a profiler writes (`_kernel_names`): return types that are
templates, wrappers, mangled names, Nsight Systems' spellings, names cut short."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from mfuscope.core.trace._kernel_names import callee_name, kernel_words
from mfuscope.core.trace.kernel_classes import classify_kernel, is_communication_kernel


@pytest.mark.parametrize(
    ("name", "callee"),
    [
        ("ampere_sgemm_128x64_nn", "ampere_sgemm_128x64_nn"),
        (
            "void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>,"
            " at::detail::Array<char*, 3> >(int, at::native::CUDAFunctor_add<float>,"
            " at::detail::Array<char*, 3>)",
            "at::native::vectorized_elementwise_kernel",
        ),
        # the anonymous namespace as c++filt and as Nsight Systems write it
        (
            "void at::native::(anonymous namespace)::CatArrayBatchedCopy<float, unsigned int, 2,"
            " 128, 1>(float*)",
            "at::native::CatArrayBatchedCopy",
        ),
        (
            "void at::native::<unnamed>::multi_tensor_apply_kernel<at::native::<unnamed>::"
            "TensorListMetadata<4>>(int)",
            "at::native::multi_tensor_apply_kernel",
        ),
        # a template as the return type, with a comparison inside its arguments
        (
            "std::enable_if<(((8)>(0)))&&vllm::_typeConvert<c10::BFloat16>::exists, void>::type"
            " vllm::fused_add_rms_norm_kernel<c10::BFloat16, 8>(c10::BFloat16*, long)",
            "vllm::fused_add_rms_norm_kernel",
        ),
        # ... and Nsight Systems' spelling of it, whose brackets do not balance
        (
            "std::enable_if<T2>(int)0&&vllm::_typeConvert<T1>::exists, void>::type"
            " vllm::fused_add_rms_norm_kernel<c10::BFloat16, (int)8>(T1 *, long, T1 *, int)",
            "vllm::fused_add_rms_norm_kernel",
        ),
        # a name cut short by a profiler's table
        (
            "void vllm::act_and_mul_kernel<c10::BFloat16, &vllm::silu_kernel<c10::BFloat16>,"
            " (bool)1>(T1 *, cons…",
            "vllm::act_and_mul_kernel",
        ),
        # lambdas in the template and parameter lists
        (
            "void at::native::elementwise_kernel<128, 2, at::native::gpu_kernel_impl<at::native::"
            "CUDAFunctor_add<float> >(at::TensorIteratorBase&, at::native::CUDAFunctor_add<float>"
            " const&)::{lambda(int)#1}>(int, at::native::gpu_kernel_impl<at::native::"
            "CUDAFunctor_add<float> >(at::TensorIteratorBase&)::{lambda(int)#1})",
            "at::native::elementwise_kernel",
        ),
        # wrappers run the operator named by their first type argument
        (
            "void cutlass::Kernel<cutlass_80_tensorop_s1688gemm_256x64_16x4_nn_align4>"
            "(cutlass_80_tensorop_s1688gemm_256x64_16x4_nn_align4::Params)",
            "cutlass_80_tensorop_s1688gemm_256x64_16x4_nn_align4",
        ),
        (
            "void cutlass::device_kernel<flash::enable_sm90_or_later<flash::FlashAttnFwdSm90<"
            "flash::CollectiveMainloopFwdSm90<2, cute::tuple<cute::C<1> >, 128>, flash::"
            "CollectiveEpilogueFwd<> > > >(flash::FlashAttnFwdSm90<>::Params)",
            "flash::FlashAttnFwdSm90",
        ),
        ("void foo<(8 > 2)>(int)", "foo"),
        # mangled: nested names, the anonymous namespace, substitutions, a wrapper with a
        # literal first argument (ck_tile::kentry<2, Op>)
        (
            "_ZN2ck16tensor_operation6device12_GLOBAL__N_139kernel_grouped_conv_fwd_xdl_cshuffle_v3"
            "INS_28GridwiseGemm_xdl_cshuffle_v3IE",
            "ck::tensor_operation::device::kernel_grouped_conv_fwd_xdl_cshuffle_v3",
        ),
        (
            "_ZN19cutlass_cudnn_train6KernelINS_4conv6kernel23ImplicitGemmConvolutionINS1_11thread",
            "conv::kernel::ImplicitGemmConvolution",
        ),
        (
            "_ZN7ck_tile6kentryILi2ENS_38FmhaBatchPrefillWithPagedKVCacheKernelINS_40Block",
            "FmhaBatchPrefillWithPagedKVCacheKernel",
        ),
        ("_Z14my_kernel_namePfi", "my_kernel_name"),
        # the CuTe DSL: kernel_cutlass_kernel_<module><Class>_object_at_<layouts>
        (
            "kernel_cutlass_kernel_flashinfernormkernelsrmsnormRMSNormKernel_object_at__tensorptr",
            "flashinfernormkernelsrmsnormRMSNormKernel",
        ),
    ],
)
def test_callee(name: str, callee: str) -> None:
    assert callee_name(name) == callee


@pytest.mark.parametrize(
    ("name", "words"),
    [
        ("void oneShotAllReduceKernel<float, 8>(int)", "one_shot_all_reduce_kernel"),
        (
            "_ZN7ck_tile6kentryILi2ENS_38FmhaBatchPrefillWithPagedKVCacheKernelINS_40Block",
            "fmha_batch_prefill_with_paged_kv_cache_kernel",
        ),
        ("void cudnn::ops::nchwToNhwcKernel<float>(float*)", "cudnn.ops.nchw_to_nhwc_kernel"),
        ("triton__0d1d2d3de4de", "triton_0d1d2d3de4de"),
    ],
)
def test_words(name: str, words: str) -> None:
    assert kernel_words(name) == words


@given(st.text(max_size=200))
def test_any_text_has_a_class_and_never_raises(name: str) -> None:
    callee_name(name)
    assert classify_kernel(name) in {"gemm", "attention", "elementwise_norm_reduce", "other"}
    is_communication_kernel(name)


@given(st.text(alphabet="<>(){}[], :&*#~!0123456789abcATZ_", max_size=120))
def test_bracket_soup_never_raises(name: str) -> None:
    kernel_words(name)
    kernel_words("void f<" + name + ">(" + name + ")")
    kernel_words("_ZN" + name)
