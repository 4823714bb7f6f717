"""Kernel classes: which kind of work a kernel does, from its name alone.

The compute (and recompute) bucket is split into four classes (docs/analyze.md, "Kernel
classes"), so the MFU waterfall can show the slice lost to unfused, memory-bound kernels
(`mfu.waterfall`'s ``f_elementwise``):

- ``gemm``: matrix math on the tensor / matrix cores: GEMMs, GEMVs, batched and grouped
  matmuls, and convolutions run as implicit GEMM;
- ``attention``: fused attention kernels (prefill, decode, backward, their split-K merges);
- ``elementwise_norm_reduce``: the memory-bound kernels: elementwise, norms, softmax,
  reductions, scans and sorts, copies and layout changes, embedding lookups, activations,
  rotary embeddings, KV-cache writes, quantisation, optimizers, FFT and Winograd transforms;
- ``other``: kernels that are none of these (set-up helpers) or whose name does not say.

A kernel is classified by the library and kernel family its callee name belongs to
(`_kernel_families`), never by the words of its template arguments or parameter types
(`_kernel_names`). The same table says which kernels are communication
(`is_communication_kernel`): those are no compute at all. The table is tested on every
distinct kernel name of the real traces the project is checked on and on a list of real names
per family with their sources (tests/data/kernel_names.tsv).
"""

from __future__ import annotations

from functools import lru_cache

from mfuscope.core.trace import _read_names
from mfuscope.core.trace._kernel_families import COMMUNICATION, FAMILIES
from mfuscope.core.trace._kernel_names import CALLEE_READ, callee_name, kernel_words
from mfuscope.core.vocabulary import KERNEL_CLASSES

__all__ = [
    "ATTENTION",
    "ELEMENTWISE_NORM_REDUCE",
    "FAMILY_NAMES",
    "GEMM",
    "KERNEL_CLASSES",
    "OTHER",
    "class_code",
    "classify_kernel",
    "family_code",
    "is_communication_kernel",
    "kernel_family",
]

# The vocabulary is the wire schema's; codes are positions in it (the engine keeps one small
# integer per kernel).
GEMM, ATTENTION, ELEMENTWISE_NORM_REDUCE, OTHER = KERNEL_CLASSES
_CODE = {name: code for code, name in enumerate(KERNEL_CLASSES)}
_UNKNOWN_FAMILY = ("unknown", OTHER)
# The selection (`_select`) keeps decoded every kernel whose lower-cased name holds one of
# these; a kernel is communication only if it does (and its family says so), so the
# selection never hides a communication kernel.
_COMM_SUBSTRINGS = _read_names.COMM_KERNEL_SUBSTRINGS


@lru_cache(maxsize=65536)
def kernel_family(name: str) -> tuple[str, str]:
    """(family, kind) of the kernel called `name`: the first family of `_kernel_families`
    whose pattern its callee's words match; kind is a kernel class or ``communication``.
    ``("unknown", "other")`` when none does."""
    return _family_of_callee(callee_name(name)[:CALLEE_READ])


@lru_cache(maxsize=65536)
def _family_of_callee(callee: str) -> tuple[str, str]:
    # Cached apart: many names share their callee (the template instances of one kernel).
    words = kernel_words(callee)
    for family in FAMILIES:
        if family.gate is not None and not any(part in words for part in family.gate):
            continue
        if family.pattern.search(words):
            return family.name, family.kind
    return _UNKNOWN_FAMILY


# Family codes: positions in this tuple (the engine keeps one small integer per kernel).
FAMILY_NAMES: tuple[str, ...] = (*(f.name for f in FAMILIES), _UNKNOWN_FAMILY[0])
_FAMILY_CODE = {name: code for code, name in enumerate(FAMILY_NAMES)}


def family_code(name: str | None) -> int:
    """`kernel_family` as a position in `FAMILY_NAMES` (None, a name not read: ``unknown``)."""
    return _FAMILY_CODE[_UNKNOWN_FAMILY[0] if name is None else kernel_family(name)[0]]


@lru_cache(maxsize=65536)
def is_communication_kernel(name: str) -> bool:
    """Whether the kernel called `name` moves data between ranks (NCCL / RCCL, collectives
    of PyTorch symmetric memory and of the custom all-reduce of vLLM / SGLang / TensorRT-LLM,
    NVSHMEM, DeepEP; docs/definitions.md#exposed-communication)."""
    if kernel_family(name)[1] != COMMUNICATION:
        return False
    lowered = name.lower()
    return any(part in lowered for part in _COMM_SUBSTRINGS)


@lru_cache(maxsize=65536)
def classify_kernel(name: str) -> str:
    """The class of a compute kernel called `name` (see the module docstring); a
    communication kernel is no compute: ``other`` if asked."""
    kind = kernel_family(name)[1]
    return OTHER if kind == COMMUNICATION else kind


def class_code(name: str | None) -> int:
    """`classify_kernel` as a position in `KERNEL_CLASSES` (None: ``other``)."""
    return _CODE[OTHER if name is None else classify_kernel(name)]
