"""Collective metadata: op names, element sizes, process groups, axes and tiers.

Sources of the names handled here:
- PyTorch ``record_param_comms`` / NCCL-kernel args (``torch/csrc/profiler/util.cpp``):
  ``Collective name`` (``allreduce``, ``_allgather_base``, ``reduce_scatter_tensor_coalesced``,
  ``send``, ``wait``, ...), ``In/Out msg nelems``, ``dtype`` (``c10::ScalarType`` names such as
  ``Float``, ``BFloat16``), ``Group size``, ``Process Group Name/Description/Ranks`` (the ranks
  list is truncated to 30 entries with ``, ...`` on big groups), ``Global rank start/stride``.
- NCCL/RCCL kernel names: ``ncclKernel_AllReduce_RING_LL_Sum_float``,
  ``ncclDevKernel_AllGather_RING_LL``, ``ncclDevKernel_Generic`` (op unknown from the name).
- gloo ``user_annotation`` names ``gloo:all_reduce`` with ``Input type`` C++ names (``float``,
  ``c10::BFloat16``, ``long int``).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

import msgspec
from mfuscope.core.trace._events import EventArgs
from mfuscope.core.trace._kernel_names import kernel_words
from mfuscope.core.vocabulary import (
    AXIS_UNKNOWN,
    TIER_INTER_NODE,
    TIER_INTRA_NODE,
    TIER_UNKNOWN,
    axis_from_description,
)

__all__ = [
    "BOOKKEEPING",
    "AttributedGroup",
    "GroupInfo",
    "ProcessGroups",
    "TopologyView",
    "dtype_size",
    "normalise_op",
    "op_from_kernel_name",
    "parse_ranks",
]

# Entries that record_param_comms emits but that move no data of their own.
BOOKKEEPING = "bookkeeping"

_OP_ALIASES: dict[str, str] = {
    "allreduce": "all_reduce",
    "allgather": "all_gather",
    "reducescatter": "reduce_scatter",
    "alltoall": "all_to_all",
    "alltoallv": "all_to_all",
    "broadcast": "broadcast",
    "reduce": "reduce",
    "send": "send",
    "recv": "recv",
    "wait": BOOKKEEPING,
    "barrier": BOOKKEEPING,
    "monitoredbarrier": BOOKKEEPING,
}
_OP_SUFFIXES = ("coalesced", "intotensor", "tensor", "base", "single")
_op_cache: dict[str, str | None] = {}


def normalise_op(name: str) -> str | None:
    """nccl-tests op name for a PyTorch/gloo collective name; `BOOKKEEPING`; None if unknown.

    ``_allgather_base`` / ``all_gather_into_tensor_coalesced`` -> ``all_gather`` and so on:
    lower-case, drop ``_`` and the variant suffixes, then look the stem up.
    """
    cached = _op_cache.get(name, "")
    if cached != "":
        return cached
    key = name.lower().replace("_", "").replace(":", "")
    if key.startswith("gloo"):
        key = key[len("gloo") :]
    changed = True
    while changed:
        changed = False
        for suffix in _OP_SUFFIXES:
            if key.endswith(suffix) and key != suffix:
                key = key[: -len(suffix)]
                changed = True
    op = _OP_ALIASES.get(key)
    _op_cache[name] = op
    return op


_KERNEL_OP = re.compile(r"nccl(?:Dev)?Kernel_([A-Za-z]+)")
_KERNEL_OPS: dict[str, str] = {
    "AllReduce": "all_reduce",
    "AllGather": "all_gather",
    "ReduceScatter": "reduce_scatter",
    "Broadcast": "broadcast",
    "Reduce": "reduce",
    "AllToAll": "all_to_all",
    "AllToAllPivot": "all_to_all",
}


# Other communication kernels (`kernel_classes.is_communication_kernel`) spell their op in
# their callee's words: PyTorch symmetric memory (two_shot_all_reduce_kernel), custom
# all-reduce (cross_device_reduce_1stage), NVSHMEM on-stream collectives (rdxn: reduction,
# fcollect: all-gather), NVSHMEM all-to-all-v, DeepEP dispatch / combine (all-to-all).
_WORD_OPS: tuple[tuple[re.Pattern[str], str], ...] = tuple(
    (re.compile(r"(?<![a-z])(?:" + pattern + r")(?![a-z])"), op)
    for pattern, op in (
        (r"reduce_?scatter", "reduce_scatter"),
        (r"all_?reduce|cross_device_reduce|rdxn", "all_reduce"),
        (r"all_?gather|fcollect", "all_gather"),
        (r"all_?to_?all(?:_?v)?|all2all|a2a|deep_ep|pplx", "all_to_all"),
        (r"broadcast", "broadcast"),
    )
)


def op_from_kernel_name(name: str) -> str | None:
    """The op a communication kernel's name spells out: NCCL's ``ncclDevKernel_AllGather_*``,
    else the words of its callee (``two_shot_all_reduce_kernel``); None when it says none
    (``ncclDevKernel_Generic``, ``SendRecv``: ambiguous; a barrier)."""
    match = _KERNEL_OP.search(name)
    if match is not None:
        return _KERNEL_OPS.get(match.group(1))
    words = kernel_words(name)
    return next((op for pattern, op in _WORD_OPS if pattern.search(words)), None)


# Bytes per element. c10::ScalarType names (record_param_comms `dtype`) and the C++ type names
# the profiler writes in `Input type` (gloo annotations), both lower-cased, `c10::` dropped.
_DTYPE_BYTES: dict[str, int] = {
    "float": 4,
    "float32": 4,
    "double": 8,
    "float64": 8,
    "half": 2,
    "float16": 2,
    "bfloat16": 2,
    "long": 8,
    "long int": 8,
    "int64": 8,
    "int": 4,
    "int32": 4,
    "short": 2,
    "short int": 2,
    "int16": 2,
    "char": 1,
    "signed char": 1,
    "byte": 1,
    "unsigned char": 1,
    "uint8": 1,
    "int8": 1,
    "bool": 1,
    "complexfloat": 8,
    "complex<float>": 8,
    "complexdouble": 16,
    "complex<double>": 16,
    "complexhalf": 4,
    "float8_e4m3fn": 1,
    "float8_e5m2": 1,
    "float8_e4m3fnuz": 1,
    "float8_e5m2fnuz": 1,
}


def dtype_size(name: Any) -> int | None:
    """Bytes per element of a dtype as the profiler names it; None when unknown."""
    if not isinstance(name, str):
        return None
    key = name.strip().lower()
    if key.startswith("c10::"):
        key = key[len("c10::") :]
    return _DTYPE_BYTES.get(key)


def parse_ranks(value: Any) -> tuple[int, ...] | None:
    """Ranks from a list or a ``"[0, 1, 2]"`` string; None when absent or truncated (``...``)."""
    if isinstance(value, list):
        if all(isinstance(r, int) and not isinstance(r, bool) for r in value):
            return tuple(value)
        return None
    if not isinstance(value, str) or "..." in value:
        return None
    body = value.strip().strip('"').strip()
    if not (body.startswith("[") and body.endswith("]")):
        return None
    parts = [p.strip() for p in body[1:-1].split(",") if p.strip()]
    try:
        return tuple(int(p) for p in parts)
    except ValueError:
        return None


class GroupInfo(msgspec.Struct, frozen=True):
    """What a trace says about one process group (any field may be unknown)."""

    name: str
    desc: str
    ranks: tuple[int, ...] | None
    size: int | None

    @property
    def known_size(self) -> int | None:
        """The size from the table, else the number of its ranks; None when neither says."""
        return self.size or (len(self.ranks) if self.ranks else None)


class AttributedGroup(msgspec.Struct, frozen=True):
    """The group a collective is attributed to, as reported: its axis, tier and size (None:
    unknown, and `unknown_reason` says why)."""

    axis: str
    tier: str
    size: int | None
    unknown_reason: str | None = None

    @classmethod
    def of(cls, group: GroupInfo, view: TopologyView, what: str) -> AttributedGroup:
        """`group`'s axis and tier under `view`; its size from the table, else its ranks.
        `what` names the group in the reason given when the size is unknown."""
        size = group.known_size
        reason = None if size is not None else f"{what} does not give its size"
        return cls(view.axis(group), view.tier(group.ranks, size), size, reason)


class ProcessGroups:
    """Process groups of ``distributedInfo.pg_config``, looked up by name."""

    def __init__(self, pg_config: Any) -> None:
        self.by_name: dict[str, GroupInfo] = {}
        if not isinstance(pg_config, list):
            return
        for entry in pg_config:
            if not isinstance(entry, dict):
                continue
            name = str(entry.get("pg_name", ""))
            size = entry.get("pg_size")
            self.by_name[name] = GroupInfo(
                name=name,
                desc=str(entry.get("pg_desc", "")),
                ranks=parse_ranks(entry.get("ranks")),
                size=size if isinstance(size, int) and size > 0 else None,
            )

    def multi_rank_groups(self) -> list[GroupInfo]:
        return [g for g in self.by_name.values() if (g.known_size or 0) > 1]


def group_from_args(args: EventArgs, groups: ProcessGroups) -> GroupInfo:
    """The process group named by record_param_comms / kernel args, completed from pg_config."""
    name = "" if args.pg_name is None else str(args.pg_name).strip('"')
    desc = "" if args.pg_desc is None else str(args.pg_desc).strip('"')
    known = groups.by_name.get(name)
    size = args.group_size
    size = size if isinstance(size, int) and not isinstance(size, bool) and size > 0 else None
    ranks = parse_ranks(args.pg_ranks)
    if ranks is not None and size is not None and len(ranks) != size:
        ranks = None
    if ranks is None and known is not None and known.ranks is not None:
        ranks = known.ranks
    if ranks is None and size is not None:
        start, stride = args.global_rank_start, args.global_rank_stride
        if isinstance(start, int) and isinstance(stride, int) and start >= 0 and stride > 0:
            ranks = tuple(start + i * stride for i in range(size))
    if not desc and known is not None:
        desc = known.desc
    if size is None:
        size = len(ranks) if ranks is not None else (known.size if known is not None else None)
    return GroupInfo(name=name, desc=desc, ranks=ranks, size=size)


class TopologyView:
    """Maps a process group to its axis and tier under the analysis options
    (docs/definitions.md#tiers)."""

    def __init__(
        self,
        *,
        world_size: int,
        gpus_per_node: int | None,
        host_of_rank: Mapping[int, str] | None,
        axis_overrides: Mapping[str, str],
    ) -> None:
        self.world_size = world_size
        self.gpus_per_node = gpus_per_node
        self.host_of_rank = host_of_rank
        self.axis_overrides = axis_overrides

    def axis(self, group: GroupInfo) -> str:
        """Override > ``mesh_<name>`` -> name > ``default_pg`` -> world > description."""
        for key in (group.name, group.desc):
            if key and key in self.axis_overrides:
                return self.axis_overrides[key]
        named = axis_from_description(group.desc)
        if named is not None:
            return named
        if group.size is not None and group.size == self.world_size and self.world_size > 1:
            return "world"
        return f"pg{group.name}" if group.name else AXIS_UNKNOWN

    def tier(self, ranks: Sequence[int] | None, size: int | None) -> str:
        """`intra_node` when every rank of the group shares one host, else `inter_node`."""
        if self.host_of_rank is not None:
            if ranks is None:
                return TIER_UNKNOWN
            hosts = {self.host_of_rank.get(r) for r in ranks}
            if None in hosts:
                return TIER_UNKNOWN
            return TIER_INTRA_NODE if len(hosts) <= 1 else TIER_INTER_NODE
        if self.gpus_per_node is None:  # CPU trace, nothing told: one host
            return TIER_INTRA_NODE
        if self.world_size <= self.gpus_per_node:
            return TIER_INTRA_NODE
        if ranks is None:
            return TIER_INTRA_NODE if size == 1 else TIER_UNKNOWN
        per_node = self.gpus_per_node
        return TIER_INTRA_NODE if len({r // per_node for r in ranks}) <= 1 else TIER_INTER_NODE
