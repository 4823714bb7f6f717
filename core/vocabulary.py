"""mfuscope's vocabulary: the names every layer uses for step buckets, link tiers, collective ops,
peak sources and parallelism axes (see docs/definitions.md). Defined once here; the wire schema
validates against these tuples and the engine, agent, collector and report all import them.

Naming a process group's parallelism axis from its description follows PyTorch: the groups a
DeviceMesh creates are named ``mesh_<dim name>`` and the default group ``default_pg``; groups made
with ``new_group(group_desc=...)`` carry the user's description, and groups without one say
``undefined``.
"""

from __future__ import annotations

__all__ = [
    "AXIS_UNKNOWN",
    "COLLECTIVE_OPS",
    "COMPONENTS",
    "KERNEL_CLASSES",
    "LINK_SPEC_SOURCES",
    "LINK_SPEC_UNKNOWN",
    "P2P_OPS",
    "PEAK_SOURCES",
    "PIPELINE_AXIS",
    "TENSOR_AXIS",
    "TIERS",
    "TIER_INTER_NODE",
    "TIER_INTRA_NODE",
    "TIER_UNKNOWN",
    "WAITING_COMPONENTS",
    "WORLD_AXIS",
    "axis_from_description",
]

# The buckets that partition a step's wall time; `bubble` is split into its two parts so the
# sum is exact.
COMPONENTS: tuple[str, ...] = (
    "compute",
    "recompute",
    "exposed_comm",
    "other",
    "bubble_pipeline",
    "bubble_idle",
)
# The buckets in which a rank waits on its peers rather than doing its own work (the rest of the
# step, `bubble_idle` included, is the rank's own time: see `core.stragglers`).
WAITING_COMPONENTS: frozenset[str] = frozenset({"exposed_comm", "bubble_pipeline"})

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


def axis_from_description(desc: str) -> str | None:
    """``mesh_<dim>`` -> ``<dim>``, ``default_pg`` -> ``world``, any other description -> itself;
    None when the description says nothing (empty or ``undefined``)."""
    desc = desc.strip()
    if desc.startswith(_MESH_PREFIX) and len(desc) > len(_MESH_PREFIX):
        return desc[len(_MESH_PREFIX) :]
    if desc == "default_pg":
        return WORLD_AXIS
    if desc and desc != "undefined":
        return desc
    return None
