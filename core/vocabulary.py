"""mfuscope's vocabulary: the names every layer uses for step buckets, link tiers, collective ops,
peak sources and parallelism axes (see docs/definitions.md). Defined once here; the wire schema
validates against these tuples and the engine, agent, collector and report all import them.

Naming a process group's parallelism axis from its description follows PyTorch: the groups a
DeviceMesh creates are named ``mesh_<dim name>`` and the default group ``default_pg``; groups made
with ``new_group(group_desc=...)`` carry the user's description, and groups without one say
``undefined``. Names that frameworks give their groups map to mfuscope's short axis names through
one table, `FRAMEWORK_AXIS_NAMES` (docs/definitions.md#axes).
"""

from __future__ import annotations

__all__ = [
    "AXIS_UNKNOWN",
    "BUBBLE_COMPONENTS",
    "COLLECTIVE_OPS",
    "COMPONENTS",
    "ELEMENTWISE_SLICE",
    "FRAMEWORK_AXIS_NAMES",
    "KERNEL_CLASSES",
    "KERNEL_INEFFICIENCY_SLICE",
    "LINK_SPEC_SOURCES",
    "LINK_SPEC_UNKNOWN",
    "P2P_OPS",
    "PEAK_SOURCES",
    "PIPELINE_AXIS",
    "SLICE_TITLES",
    "TENSOR_AXIS",
    "TIERS",
    "TIER_INTER_NODE",
    "TIER_INTRA_NODE",
    "TIER_UNKNOWN",
    "TRACE_COMPONENTS",
    "WAITING_COMPONENTS",
    "WATERFALL_SLICES",
    "WORLD_AXIS",
    "axis_from_description",
    "canonical_axis",
    "component_axis",
]

# The buckets that partition a step's wall time; `bubble` is split into its two parts so the
# sum is exact. `instrumentation` is the profiler's own cost on a profiled step's training thread
# (start, step marks, stop): measured by the agent, never seen on a trace's own timeline.
COMPONENTS: tuple[str, ...] = (
    "compute",
    "recompute",
    "exposed_comm",
    "other",
    "bubble_pipeline",
    "bubble_idle",
    "instrumentation",
)
# The buckets of a trace's own timeline (`mfuscope analyze`): all but `instrumentation`, which only
# the live agent measures.
TRACE_COMPONENTS: tuple[str, ...] = tuple(c for c in COMPONENTS if c != "instrumentation")
# The buckets in which a rank waits on its peers rather than doing its own work (the rest of the
# step, `bubble_idle` included, is the rank's own time: see `core.stragglers`).
WAITING_COMPONENTS: frozenset[str] = frozenset({"exposed_comm", "bubble_pipeline"})
# The buckets in which the device runs nothing: together they are the bubble.
BUBBLE_COMPONENTS: tuple[str, ...] = ("bubble_pipeline", "bubble_idle")

# The slices of ``1 - MFU`` (docs/definitions.md#mfu-waterfall), in the order they are shown (the
# order of the waterfall's formula): every bucket but compute, then compute's shortfall from peak
# in two parts, the unfused / memory-bound kernels and the rest. The core waterfall, the report
# and the CLI iterate this; the recording rules and dashboards take every bucket but compute.
ELEMENTWISE_SLICE = "elementwise"
KERNEL_INEFFICIENCY_SLICE = "kernel_inefficiency"
WATERFALL_SLICES: tuple[str, ...] = (
    "exposed_comm",
    "bubble_pipeline",
    "bubble_idle",
    "recompute",
    "other",
    "instrumentation",
    ELEMENTWISE_SLICE,
    KERNEL_INEFFICIENCY_SLICE,
)
# How the buckets and slices are named for people (CLI tables, the live view, the report).
SLICE_TITLES: dict[str, str] = {
    "compute": "compute",
    "recompute": "recompute",
    "exposed_comm": "exposed comm",
    "other": "other",
    "bubble_pipeline": "pipeline bubble",
    "bubble_idle": "idle",
    "instrumentation": "profiler",
    ELEMENTWISE_SLICE: "unfused kernels",
    KERNEL_INEFFICIENCY_SLICE: "kernel inefficiency",
}

TIER_INTRA_NODE = "intra_node"
TIER_INTER_NODE = "inter_node"
TIER_UNKNOWN = "unknown"
TIERS: tuple[str, ...] = (TIER_INTRA_NODE, TIER_INTER_NODE, TIER_UNKNOWN)

# Where a device's peak FLOP/s came from: the datasheet table, a calibration run, the user, or
# nowhere (MFU is then not computed).
PEAK_SOURCES: tuple[str, ...] = ("spec", "measured", "user", "unknown")

# Where a link's bandwidth spec came from (docs/definitions.md#link-specs): a vendor datasheet
# (the device table or a reference design), the node's sysfs (NIC port rates), NVML (NVLink and
# PCIe of the GPU), the user, or nowhere. An `unknown` spec has no rate and no efficiency is
# computed against it.
LINK_SPEC_UNKNOWN = "unknown"
LINK_SPEC_SOURCES: tuple[str, ...] = ("datasheet", "sysfs", "nvml", "user", LINK_SPEC_UNKNOWN)

# Collective op names as nccl-tests spells them; the point-to-point ones carry pipeline traffic.
# Kernel classes the compute bucket is split into (docs/analyze.md, "Kernel classes").
KERNEL_CLASSES: tuple[str, ...] = ("gemm", "attention", "elementwise_norm_reduce", "other")

COLLECTIVE_OPS: tuple[str, ...] = (
    "all_reduce",
    "all_gather",
    "reduce_scatter",
    "all_to_all",
    "broadcast",
    "reduce",
    "send",
    "recv",
)

P2P_OPS: tuple[str, ...] = ("send", "recv")

# Axis names with a meaning of their own: the whole world, the pipeline axis (its exposed p2p
# waits are pipeline bubble), and tensor parallelism (expected inside one host's fast links).
WORLD_AXIS = "world"
PIPELINE_AXIS = "pp"
TENSOR_AXIS = "tp"
AXIS_UNKNOWN = "unknown"
_MESH_PREFIX = "mesh_"
# Megatron-core also builds a gloo twin of some groups, named like the group plus this suffix.
_GLOO_TWIN_SUFFIX = "_GLOO"

# Process-group descriptions and DeviceMesh dim names that common frameworks use -> the axis.
# Megatron-core (also used by NeMo) names its groups in `parallel_state.initialize_model_parallel`
# (``new_group(group_desc=...)``); the axis is the short key Megatron-core itself gives each
# group's communicator options there. Lightning's ModelParallelStrategy and DeepSpeed name their
# DeviceMesh dims in words. A name that is not here is kept as it is (torchtitan's mesh dims
# ``dp_shard``, ``dp_replicate``, ``cp``, ``tp``, ``pp``, ``ep`` are already short).
FRAMEWORK_AXIS_NAMES: dict[str, str] = {
    # Megatron-core / NeMo
    "TENSOR_MODEL_PARALLEL_GROUP": TENSOR_AXIS,
    "PIPELINE_MODEL_PARALLEL_GROUP": PIPELINE_AXIS,
    "DATA_PARALLEL_GROUP": "dp",
    "CONTEXT_PARALLEL_GROUP": "cp",
    "EXPERT_MODEL_PARALLEL_GROUP": "ep",
    "DATA_PARALLEL_GROUP_WITH_CP": "dp_cp",
    "INTRA_PARTIAL_DATA_PARALLEL_GROUP_WITH_CP": "intra_dp_cp",
    "INTER_PARTIAL_DATA_PARALLEL_GROUP_WITH_CP": "inter_dp_cp",
    "MODEL_PARALLEL_GROUP": "mp",
    "EMBEDDING_GROUP": "embd",
    "POSITION_EMBEDDING_GROUP": "pos_embd",
    "TENSOR_AND_DATA_PARALLEL_GROUP": "tp_dp",
    "TENSOR_AND_DATA_PARALLEL_GROUP_WITH_CP": "tp_dp_cp",
    "TENSOR_AND_CONTEXT_PARALLEL_GROUP": "tp_cp",
    "EXPERT_TENSOR_PARALLEL_GROUP": "ep_tp",
    "EXPERT_TENSOR_AND_MODEL_PARALLEL_GROUP": "tp_ep_mp",
    "EXPERT_TENSOR_MODEL_PIPELINE_PARALLEL_GROUP": "tp_ep_pp",
    "EXPERT_DATA_PARALLEL_GROUP": "ep_dp",
    # DeviceMesh dim names in words: Lightning ModelParallelStrategy ("data_parallel",
    # "tensor_parallel"), DeepSpeed ("data_parallel", "sequence_parallel"), and their kin.
    "data_parallel": "dp",
    "tensor_parallel": TENSOR_AXIS,
    "pipeline_parallel": PIPELINE_AXIS,
    "context_parallel": "cp",
    "sequence_parallel": "sp",
    "expert_parallel": "ep",
    "model_parallel": "mp",
}


def canonical_axis(name: str) -> str:
    """The axis a group or mesh-dim `name` stands for: `FRAMEWORK_AXIS_NAMES` (a Megatron-core
    gloo twin ``<NAME>_GLOO`` like ``<NAME>``), else `name` itself."""
    if name in FRAMEWORK_AXIS_NAMES:
        return FRAMEWORK_AXIS_NAMES[name]
    if name.endswith(_GLOO_TWIN_SUFFIX):
        return FRAMEWORK_AXIS_NAMES.get(name[: -len(_GLOO_TWIN_SUFFIX)], name)
    return name


def axis_from_description(desc: str) -> str | None:
    """``mesh_<dim>`` -> ``<dim>``, ``default_pg`` -> ``world``, any other description -> itself,
    each through `canonical_axis` (``TENSOR_MODEL_PARALLEL_GROUP`` -> ``tp``); None when the
    description says nothing (empty or ``undefined``)."""
    desc = desc.strip()
    if desc.startswith(_MESH_PREFIX) and len(desc) > len(_MESH_PREFIX):
        return canonical_axis(desc[len(_MESH_PREFIX) :])
    if desc == "default_pg":
        return WORLD_AXIS
    if desc and desc != "undefined":
        return canonical_axis(desc)
    return None


def component_axis(component: str, axis: str) -> str:
    """The axis a step bucket is reported on: ``exposed_comm`` its collectives' (carried on the
    wire); ``bubble_pipeline`` always `PIPELINE_AXIS`, because only the waits of send/recv on the
    ``pp`` axis become pipeline bubble (docs/definitions.md#pipeline-bubble) and so the wire does
    not carry it; any other bucket none (``""``)."""
    if component == "bubble_pipeline":
        return PIPELINE_AXIS
    return axis
