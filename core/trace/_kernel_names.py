"""A kernel's own name, out of what a profiler writes for it: the words the kernel classes and
the communication rule read (docs/analyze.md, "Kernel classes").

A Kineto kernel name is whatever the compiler or library calls the kernel:
- a demangled C++ signature, ``void at::native::vectorized_elementwise_kernel<4,
  at::native::CUDAFunctor_add<float>, ...>(int, ...)``: a return type, the callee's qualified
  name, template arguments (nested ``<>``, parenthesised lambdas, ``(anonymous namespace)``) and
  a parameter list;
- a mangled one (Itanium ABI), ``_ZN2ck16tensor_operation6device...I...E...``, when the
  profiler could not demangle it;
- a plain symbol: ``ampere_sgemm_128x64_nn``, ``nvjet_tst_192x192_64x4_2x1_v_bz_coopB_NNT``,
  ``triton_poi_fused_add_0``, ``Cijk_Ailk_Bljk_...``.

What a kernel does is in its callee name (namespaces and function name), never in its template
arguments or parameter types, which name whatever types it was instantiated with
(``vllm::_typeConvert``, ``cutlass::gemm::GemmShape`` inside a convolution, ``cudnn::reduced_
divisor`` inside an FFT). The exception is a launch wrapper: ``cutlass::Kernel<Op>``,
``cutlass::device_kernel<Op>``, ``ck_tile::kentry<2, Op>`` and ``enable_sm90_or_later<Op>`` run
the operator ``Op``, so the callee is ``Op``'s name; so does a CuTe DSL kernel
``kernel_cutlass_kernel_<module><Op>_object_at_<layouts>``.

`kernel_words` gives that callee as lower-case words separated by ``_`` and ``.`` (for
``::``), camelCase split: ``FmhaBatchPrefillWithPagedKVCacheKernel`` ->
``fmha_batch_prefill_with_paged_kv_cache_kernel``. Pure string work, linear in the name's
length (a name comes from a trace: it may be anything).
"""

from __future__ import annotations

import re

__all__ = ["CALLEE_READ", "callee_name", "kernel_words"]

# What names a kernel's family comes first in its callee; generated names carry long tails of
# tuning parameters after it (hipBLASLt's Cijk_Ailk_Bljk_..._MT128x256x32_MI16x16x1_..., several
# hundred characters) that only cost time to read.
CALLEE_READ = 160

# How demanglers write the anonymous namespace (c++filt, Nsight Systems, MSVC).
_ANONYMOUS = ("(anonymous namespace)::", "<unnamed>::", "{anonymous}::", "`anonymous namespace'::")
# The last component of a wrapper that launches the operator named by its first type argument.
_WRAPPERS = frozenset({"Kernel", "Kernel2", "device_kernel", "kentry"})
# FlashAttention, vLLM, PyTorch: enable_sm90_or_later<Op>, enable_3x_kernel_for_sm9x<Op>, ...
_WRAPPER_PREFIXES = ("enable_",)
# The CuTe DSL (CUTLASS's Python DSL) names a kernel kernel_cutlass_kernel_<module><Class>
# _object_at_<layouts>: the class is the operator; the layouts name MMA atoms of any kernel.
_CUTE_DSL_PREFIX = "kernel_cutlass_kernel_"
_CUTE_DSL_END = "_object_at_"

# Itanium mangling, as much of it as names a callee: <length><identifier> source names,
# substitutions (S_, S0_, St), the anonymous namespace (_GLOBAL__N_1), literals (Li2E).
_SOURCE_NAME = re.compile(r"(\d+)")
_SUBSTITUTION = re.compile(r"S[0-9A-Z]*_|St|Sa|Sb|Ss|Si|So|Sd")
_LITERAL = re.compile(r"L[a-z]+n?\d+E|Lb[01]E")
_QUALIFIERS = "rVKRO"  # cv- and ref-qualifiers of a nested name
_WRAPPED_AT_MOST = 8  # wrappers inside wrappers read (two in real names: device_kernel<enable_...>)
_ANONYMOUS_MANGLED = "_GLOBAL__N_"
_GLOBAL_NAMESPACE = re.compile(r"_GLOBAL__N_\w*::")

_CALLEE_END = re.compile(r"[<(]")
# Where camelCase starts a word: a capital after a lower-case letter or digit, or the last capital
# of an acronym followed by a lower-case letter (KVCache -> KV_Cache).
_CAMEL = re.compile(r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])")
_SEPARATORS = re.compile(r"[^a-z0-9.]+")
_DOTS = re.compile(r"[._]*\.[._]*")
# Words already in their final form: single underscores between letters and digits.
_PLAIN_WORDS = re.compile(r"[a-z0-9]+(?:[._][a-z0-9]+)*")


def callee_name(name: str) -> str:
    """The qualified name of the function the kernel runs (see the module docstring), as
    written: ``at::native::vectorized_elementwise_kernel``, ``cutlass_80_tensorop_s1688gemm_
    256x64_16x4_nn_align4`` (out of ``cutlass::Kernel<...>``), ``ck::tensor_operation::device::
    kernel_batched_gemm_xdlops_bwd_weight`` (out of a mangled name)."""
    text = name.strip()
    if text.startswith(_CUTE_DSL_PREFIX):
        return text[len(_CUTE_DSL_PREFIX) :].split(_CUTE_DSL_END, 1)[0]
    if text.startswith("_Z"):
        return "::".join(_mangled_callee(text)) or text
    for anonymous in _ANONYMOUS:
        if anonymous in text:
            text = text.replace(anonymous, "")
    if "_GLOBAL__N_" in text:  # a per-file anonymous namespace spelled out (nvcc)
        text = _GLOBAL_NAMESPACE.sub("", text)
    return _simple_callee(text) or _demangled_callee(text)


def _simple_callee(text: str) -> str | None:
    """The common case, cheaply: ``[void ]callee[<...>](...)`` with no template in the return
    type and no wrapper: the callee ends at its first ``<`` or ``(`` (a kernel is never a
    member of a class template). None when the name is not of that shape."""
    if text.startswith("void "):
        text = text[5:]
    end = _CALLEE_END.search(text)
    callee = text if end is None else text[: end.start()]
    if " " in callee or (end is not None and end.group() == "<" and _is_wrapper(callee)):
        return None
    return callee


def kernel_words(name: str) -> str:
    """`callee_name` (its first `CALLEE_READ` characters) as lower-case words: ``::`` becomes
    ``.``, camelCase and every other separator ``_``; ``vllm::fused_add_rms_norm_kernel<...>``
    -> ``vllm.fused_add_rms_norm_kernel``, ``oneShotAllReduceKernel`` ->
    ``one_shot_all_reduce_kernel``."""
    callee = callee_name(name)[:CALLEE_READ]
    if not callee.islower():  # camelCase to split (most callees are snake_case already)
        callee = _CAMEL.sub("_", callee).lower()
    words = callee.replace(".", "_").replace("::", ".")
    if _PLAIN_WORDS.fullmatch(words) is None:
        words = _DOTS.sub(".", _SEPARATORS.sub("_", words))
    return words.strip("._")


def _demangled_callee(text: str) -> str:
    """The word before the template arguments of the callee, before its parameter list; for
    a wrapper, the callee of its first type argument. Read from the end: the return type may
    itself be a template, spelled so that its brackets do not balance (Nsight Systems writes
    ``std::enable_if<T2>(int)0&&vllm::_typeConvert<T1>::exists, void>::type
    vllm::fused_add_rms_norm_kernel<c10::BFloat16, (int)8>(T1 *, ...)``). A name cut short
    (no closing parenthesis) is read from the start instead."""
    callee = ""
    for _ in range(_WRAPPED_AT_MOST):
        head = text.strip()
        if head.endswith(")"):
            head = head[: _opening(head, len(head) - 1)].rstrip()
        else:
            head = head[: _scan(head, 0, "(")].rstrip()
        arguments = None
        if head.endswith(">"):
            start = _opening(head, len(head) - 1)
            arguments, head = head[start + 1 : -1], head[:start]
        callee = head.rsplit(" ", 1)[-1]
        if arguments is None or not _is_wrapper(callee):
            return callee
        types = (a.strip() for a in _top_level_arguments(arguments))
        inner = next((a for a in types if a and not _is_value(a)), None)
        if inner is None:
            return callee
        text = inner
    return callee


_OPEN = {")": "(", "]": "[", "}": "{", ">": "<"}


def _opening(text: str, end: int) -> int:
    """The position of the bracket that opens the one closing at `end`, scanning backwards
    (inside parentheses ``<`` and ``>`` are comparisons); 0 when unbalanced."""
    stack: list[str] = []
    for i in range(end, -1, -1):
        ch = text[i]
        if ch in ")]}" or (ch == ">" and (not stack or stack[-1] == ">")):
            stack.append(ch)
        elif ch in "([{<" and stack and _OPEN[stack[-1]] == ch:
            stack.pop()
            if not stack:
                return i
    return 0


def _top_level_arguments(arguments: str) -> list[str]:
    out, start = [], 0
    while True:
        comma = _scan(arguments, start, ",")
        out.append(arguments[start:comma])
        if comma >= len(arguments):
            return out
        start = comma + 1


def _scan(text: str, start: int, stop: str) -> int:
    """The first `stop` from `start` outside every bracket (inside parentheses ``<`` and
    ``>`` are comparisons); the end of the text if none."""
    stack: list[str] = []
    for i in range(start, len(text)):
        ch = text[i]
        if ch == stop and not stack:
            return i
        if ch in "({[" or (ch == "<" and (not stack or stack[-1] == "<")):
            stack.append(ch)
        elif ch in _OPEN and stack and stack[-1] == _OPEN[ch]:
            stack.pop()
    return len(text)


def _is_value(argument: str) -> bool:
    """A non-type template argument: a number, a cast number, true/false."""
    return argument[0].isdigit() or argument[0] in "(-" or argument in ("true", "false")


def _is_wrapper(callee: str) -> bool:
    last = callee.rsplit("::", 1)[-1]
    return last in _WRAPPERS or last.startswith(_WRAPPER_PREFIXES)


def _mangled_callee(text: str) -> list[str]:
    """The source names of a mangled callee (``_ZN2ck6kernelI...`` -> ``["ck", "kernel"]``),
    the wrapped operator's for a wrapper; [] when the text is not a mangled function name."""
    position = 2
    if text.startswith("L", position):  # internal linkage: _ZL
        position += 1
    names, position = _mangled_names(text, position)
    if names and _is_wrapper("::".join(names)) and text.startswith("I", position):
        position += 1
        while True:  # the first template argument that is a type
            literal = _LITERAL.match(text, position)
            if literal is None:
                break
            position = literal.end()
        inner, _ = _mangled_names(text, position)
        if inner:
            return inner
    return names


def _mangled_names(text: str, position: int) -> tuple[list[str], int]:
    """Source names from `position`: a nested name (``N ... E``) or one unscoped name; the
    position after them (at the template arguments' ``I`` when there are any)."""
    nested = text.startswith("N", position)
    if nested:
        position += 1
        while position < len(text) and text[position] in _QUALIFIERS:
            position += 1
    names: list[str] = []
    while position < len(text):
        substitution = _SUBSTITUTION.match(text, position)
        if substitution is not None:
            position = substitution.end()
            continue
        length = _SOURCE_NAME.match(text, position)
        if length is None:
            break
        start = length.end()
        position = start + int(length.group(1))
        identifier = text[start:position]
        if not identifier.startswith(_ANONYMOUS_MANGLED):
            names.append(identifier)
        if not nested:
            break
    return names, position
