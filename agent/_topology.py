"""Who this rank is and whom it talks to, discovered once at start.

`discover_topology` (torch side) gathers every rank's host name and node claim (node name, boot id,
GPU: `mfuscope.agent._node_identity`) with one `all_gather_object` and lists the process groups
this rank belongs to; the same collective hands every rank rank 0's
fresh random *incarnation* (this launch's id: a relaunch after a crash gets a new one).
`build_topology` (pure) names each group's axis and tier:

- axis: the user's `axis_overrides` entry for the group's name, description or DeviceMesh dim
  name; else the DeviceMesh dim name when the group is one of the mesh's dims; else the group
  description (`mesh_<name>` -> `<name>`, `default_pg` -> `world`, as the engine names groups in
  traces); else `pg<name>`. Mesh dim names and descriptions go through the table of framework
  names (`vocabulary.canonical_axis`: ``TENSOR_MODEL_PARALLEL_GROUP`` -> ``tp``).
- tier: `intra_node` when all the group's ranks share one node, else `inter_node`
  (`unknown` when a rank's node is unknown). The node is the node identity
  (docs/definitions.md#node-identity), not the host name: two pods on one node share a node.
  A `tp` group on several nodes is flagged: tensor parallelism has spilled past the NVLink
  boundary (docs/definitions.md#tp-spanning-hosts).
"""

from __future__ import annotations

import dataclasses
import os
import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from mfuscope.agent._node_identity import NodeClaim, Placement, local_claim, place_ranks
from mfuscope.core.flight_accounting import GroupName, GroupNames
from mfuscope.core.link_specs import LinkSpec
from mfuscope.core.schema import GroupInfo, Topology
from mfuscope.core.vocabulary import (
    TENSOR_AXIS,
    TIER_UNKNOWN,
    axis_from_description,
    canonical_axis,
)

__all__ = [
    "GroupSpec",
    "GroupView",
    "RankTopology",
    "assign_gloo_workers",
    "axis_of_group",
    "build_topology",
    "discover_gloo_workers",
    "discover_topology",
    "group_names",
    "new_incarnation",
]


@dataclass(frozen=True)
class GroupSpec:
    """A process group as torch.distributed knows it: name, description, global ranks."""

    name: str
    desc: str
    ranks: tuple[int, ...]


@dataclass(frozen=True)
class GroupView:
    """A group with the names mfuscope reports it under."""

    name: str
    desc: str
    ranks: tuple[int, ...]
    axis: str
    tier: str
    hosts: tuple[str, ...]
    nodes: tuple[str, ...] = ()  # node identities (empty: the hosts stand in)

    @property
    def spans_hosts(self) -> bool:
        """The group's ranks sit on more than one node (the name predates node identities)."""
        return len(self.nodes or self.hosts) > 1


@dataclass(frozen=True)
class RankTopology:
    rank: int
    local_rank: int
    world_size: int
    host: str
    host_of_rank: Mapping[int, str] = field(default_factory=dict)
    groups: tuple[GroupView, ...] = ()
    # This launch's id, the same on every rank of it (see `new_incarnation`).
    incarnation: str = ""
    # Node identity of every rank (tiers compare these) and this rank's node label.
    node_of_rank: Mapping[int, str] = field(default_factory=dict)
    node: str = ""
    node_source: str = "host"  # node_name, boot_id or host (docs/definitions.md#node-identity)
    placement_problems: tuple[str, ...] = ()
    # Rank 0's `agree` values from `discover_topology` (None: the ranks could not agree).
    agreed: tuple[Any, ...] | None = None
    # Ids of the node's NICs this rank samples (`Placement.nic_readers`); None: the job's node
    # claims are unknown, local rank 0 samples them all.
    nics_read: frozenset[str] | None = None

    @property
    def axis_of_group_name(self) -> dict[str, str]:
        """Process-group name -> axis, for the engine's axis overrides."""
        return {g.name: g.axis for g in self.groups}

    @property
    def tp_spans_hosts(self) -> bool:
        return any(g.axis == TENSOR_AXIS and g.spans_hosts for g in self.groups)

    def to_schema(
        self,
        link_peak_bytes_per_s: Mapping[str, float] | None = None,
        group_specs: Mapping[str, LinkSpec] | None = None,
    ) -> Topology:
        """The wire `Topology`: one entry per distinct (axis, tier, size, spans_hosts).

        `link_peak_bytes_per_s` maps a tier to its unidirectional spec rate, when known;
        `group_specs` (group name -> `LinkSpec`, with its source) takes precedence for its groups.
        """
        peaks = link_peak_bytes_per_s or {}
        specs = group_specs or {}
        seen: dict[tuple[str, str, int, bool], GroupInfo] = {}
        for g in self.groups:
            key = (g.axis, g.tier, len(g.ranks), g.spans_hosts)
            spec = specs.get(g.name)
            seen.setdefault(
                key,
                GroupInfo(
                    axis=g.axis,
                    tier=g.tier,
                    size=len(g.ranks),
                    spans_hosts=g.spans_hosts,
                    link_peak_bytes_per_s=peaks.get(g.tier) if spec is None else spec.bytes_per_s,
                    link_peak_source=None if spec is None else spec.source,
                ),
            )
        return Topology(groups=tuple(seen.values()))

    def nics_sampled(self, nic_ids: Mapping[str, str]) -> tuple[str, ...]:
        """Of this node's NICs (device name -> id, `_hw_readers.nic_ids`), the names of those
        this rank samples: one rank per NIC and node; without the job's claims, local rank 0
        samples them all."""
        if self.nics_read is None:
            return tuple(nic_ids) if self.local_rank == 0 else ()
        return tuple(name for name, nic in nic_ids.items() if nic in self.nics_read)

    def ranks_on_own_node(self, group: GroupView) -> int:
        """How many of `group`'s ranks share this rank's node (at least 1: this rank). Nodes, not
        host names: two pods on one node drive the same NICs (docs/definitions.md#node-identity).
        """
        own = self.node_of_rank.get(self.rank)
        if own is None:
            return 1
        same = sum(1 for r in group.ranks if self.node_of_rank.get(r) == own)
        return max(same, 1)


def axis_of_group(
    spec: GroupSpec, mesh_axes: Mapping[str, str], overrides: Mapping[str, str] | None = None
) -> str:
    """The axis name of a group (see the module docstring for the rules)."""
    given = overrides or {}
    for key in (spec.name, spec.desc, mesh_axes.get(spec.name)):
        if key and key in given:
            return given[key]
    if spec.name in mesh_axes:
        return canonical_axis(mesh_axes[spec.name])
    named = axis_from_description(spec.desc)
    return named if named is not None else f"pg{spec.name}"


def build_topology(
    *,
    rank: int,
    local_rank: int,
    hosts: Sequence[str | None],
    groups: Sequence[GroupSpec],
    mesh_axes: Mapping[str, str] | None = None,
    incarnation: str = "",
    placement: Placement | None = None,
    axis_overrides: Mapping[str, str] | None = None,
) -> RankTopology:
    """Name axes and tiers of `groups` given the host of every rank (`hosts[r]`, None = unknown)
    and their `placement` on nodes (None: each host is its own node).

    Raises ValueError when `rank` is not a valid index into `hosts`, or `placement` is not
    one entry per rank.
    """
    if not 0 <= rank < len(hosts):
        raise ValueError(f"rank {rank} outside a world of {len(hosts)}")
    claimed = placement is not None
    if placement is None:
        placement = place_ranks([None if h is None else NodeClaim(host=h) for h in hosts])
    if len(placement.nodes) != len(hosts):
        raise ValueError(f"{len(placement.nodes)} node entries for a world of {len(hosts)}")
    nodes = placement.nodes
    axes = mesh_axes or {}
    host_of_rank = {r: h for r, h in enumerate(hosts) if h}
    views = []
    for spec in groups:
        inside = [r for r in spec.ranks if 0 <= r < len(hosts)]
        known = sorted({h for h in (hosts[r] for r in inside) if h})
        group_nodes = [nodes[r] if 0 <= r < len(nodes) else None for r in spec.ranks]
        on_nodes = sorted({n for n in group_nodes if n})
        if any(n is None for n in group_nodes):
            tier = "unknown"
        else:
            tier = "intra_node" if len(on_nodes) <= 1 else "inter_node"
        views.append(
            GroupView(
                name=spec.name,
                desc=spec.desc,
                ranks=tuple(spec.ranks),
                axis=axis_of_group(spec, axes, axis_overrides),
                tier=tier,
                hosts=tuple(known),
                nodes=tuple(on_nodes),
            )
        )
    return RankTopology(
        rank=rank,
        local_rank=local_rank,
        world_size=len(hosts),
        host=hosts[rank] or "unknown",
        host_of_rank=host_of_rank,
        groups=tuple(views),
        incarnation=incarnation,
        node_of_rank={r: n for r, n in enumerate(nodes) if n},
        node=placement.labels[rank] or hosts[rank] or "unknown",
        node_source=placement.source,
        placement_problems=placement.problems,
        nics_read=placement.nic_readers[rank] if claimed and placement.nic_readers else None,
    )


def group_names(topology: RankTopology) -> GroupNames:
    """Names of a process group by its name (and description, for a group created after the
    agent: its axis from the description as `axis_of_group` names it, tier unknown, size unknown).
    """
    known = {g.name: GroupName(g.axis, g.tier, len(g.ranks)) for g in topology.groups}
    later: dict[tuple[str, str], GroupName] = {}

    def names(name: str, desc: str) -> GroupName:
        found = known.get(name)
        if found is not None:
            return found
        key = (name, desc)
        if key not in later:
            spec = GroupSpec(name=name, desc=desc, ranks=())
            later[key] = GroupName(axis_of_group(spec, {}), TIER_UNKNOWN, None)
        return later[key]

    return names


def new_incarnation(environ: Mapping[str, str] | None = None) -> str:
    """A fresh id for this launch: 16 random hex digits. Only rank 0's is used when the ranks
    can agree on one (`discover_topology`). When they cannot, the torchrun run id and restart
    count (the same on every rank of one launch, different after an elastic restart or a new
    torchrun) stand in; without them, a random id per process."""
    env = os.environ if environ is None else environ
    run_id = env.get("TORCHELASTIC_RUN_ID")
    if run_id:
        return f"{run_id}/{env.get('TORCHELASTIC_RESTART_COUNT', '0')}"[:256]
    return secrets.token_hex(8)


def _env_int(name: str, default: int) -> int:
    try:
        return int(os.environ.get(name, default))
    except ValueError:
        return default


def _process_groups(dist: Any, rank: int) -> list[GroupSpec]:
    """Groups this rank belongs to, from torch.distributed's registry (private but stable
    since 2.0: the profiler reads the same `_world` for its `distributedInfo.pg_config`)."""
    from torch.distributed import distributed_c10d as c10d

    specs = []
    for pg, rank_map in list(c10d._world.pg_group_ranks.items()):
        if not isinstance(pg, dist.ProcessGroup) or rank not in rank_map:
            continue
        ranks = tuple(sorted(rank_map, key=lambda r: rank_map[r]))
        specs.append(
            GroupSpec(
                name=str(getattr(pg, "group_name", "")),
                desc=str(getattr(pg, "group_desc", "")),
                ranks=ranks,
            )
        )
    return specs


def _mesh_axes(mesh: Any) -> dict[str, str]:
    axes: dict[str, str] = {}
    for dim_name in getattr(mesh, "mesh_dim_names", None) or ():
        group = mesh.get_group(dim_name)
        axes[str(group.group_name)] = str(dim_name)
    return axes


def discover_topology(
    mesh: Any = None,
    agree: tuple[Any, ...] | None = None,
    node_name: str | None = None,
    axis_overrides: Mapping[str, str] | None = None,
    nics: tuple[str, ...] = (),
) -> RankTopology:
    """Rank, local rank, host and node of every rank, groups and the launch's incarnation;
    collective on the default group. Rank 0's `agree` values ride along and come back as
    `agreed` on every rank (the profiled-window schedule's parameters).

    Every rank must call it (the Agent does, at construction). `node_name` is the agent's
    ``node_name`` option (docs/definitions.md#node-identity); `nics` the ids of the NICs this
    rank can read (`_hw_readers.nic_ids`), which decide the NICs it samples (`nics_read`).
    Without torch.distributed initialised it describes a single process from the
    `RANK`/`LOCAL_RANK` environment.
    """
    import torch.distributed as dist
    from mfuscope.agent.gpu_identity import current_gpu_ref

    gpu = current_gpu_ref()
    claim = local_claim(node_name=node_name, gpu_bus_id=gpu.pci_bus_id if gpu else None, nics=nics)
    if not (dist.is_available() and dist.is_initialized()):
        rank = _env_int("RANK", 0)
        world = max(_env_int("WORLD_SIZE", 1), rank + 1)
        claims: list[NodeClaim | None] = [None] * world
        claims[rank] = claim
        alone = build_topology(
            rank=rank,
            local_rank=_env_int("LOCAL_RANK", 0),
            hosts=[c.host if c is not None else None for c in claims],
            groups=(),
            incarnation=new_incarnation(),
            placement=place_ranks(claims),
        )
        # Several processes that cannot see each other's claims: local rank 0 samples the NICs.
        return dataclasses.replace(
            alone,
            agreed=agree if world == 1 else None,
            nics_read=alone.nics_read if world == 1 else None,
        )
    rank = dist.get_rank()
    world = dist.get_world_size()
    gathered: list[Any] = [None] * world
    # One collective for all: every rank's node claim, rank 0's id for this launch and its
    # `agree` values.
    dist.all_gather_object(gathered, (claim, secrets.token_hex(8), agree))
    claims = [_claim_of(entry) for entry in gathered]
    hosts = [c.host if c is not None else None for c in claims]
    placement = place_ranks(claims)
    incarnation = _incarnation_of(gathered[0])
    mine = placement.nodes[rank]
    same_node_before = sum(1 for r in range(rank) if placement.nodes[r] == mine)
    local_rank = _env_int("LOCAL_RANK", same_node_before)
    topology = build_topology(
        rank=rank,
        local_rank=local_rank,
        hosts=hosts,
        groups=_process_groups(dist, rank),
        mesh_axes=_mesh_axes(mesh) if mesh is not None else None,
        incarnation=incarnation,
        placement=placement,
        axis_overrides=axis_overrides,
    )
    return dataclasses.replace(topology, agreed=_agreed_of(gathered[0]))


def _claim_of(entry: Any) -> NodeClaim | None:
    claim = entry[0] if isinstance(entry, tuple) and entry else None
    if isinstance(claim, NodeClaim):
        return claim
    return NodeClaim(host=claim) if isinstance(claim, str) and claim else None


def _agreed_of(entry: Any) -> tuple[Any, ...] | None:
    value = entry[2] if isinstance(entry, tuple) and len(entry) > 2 else None
    return value if isinstance(value, tuple) else None


def _incarnation_of(entry: Any) -> str:
    value = entry[1] if isinstance(entry, tuple) and len(entry) > 1 else None
    return value if isinstance(value, str) and value else new_incarnation()


# --- gloo worker threads -> process groups -------------------------------------------------
# A gloo collective is recorded on a worker thread of its group and does not name the group
# (docs/analyze.md, "Groups of gloo collectives"). Every ProcessGroupGloo starts its own worker
# threads (`options._threads` of them, named ``pt_gloo_runloop``) in its constructor, so Linux
# allocates their thread ids in group creation order: sorted, the ids fall into consecutive runs,
# one run per gloo group this rank belongs to, in the order torch.distributed created them.

GLOO_WORKER_THREAD_NAME = "pt_gloo_runloop"


def assign_gloo_workers(
    groups_in_order: Sequence[tuple[str, int]], worker_tids: Sequence[int]
) -> dict[int, str] | None:
    """Worker thread id -> group name, given the rank's gloo groups in creation order with their
    worker-thread counts and the ids of the process's gloo worker threads.

    None (no map: the groups of gloo collectives stay unknown) when the thread count is not the
    sum of the groups' counts: threads of a group torch.distributed does not list (a debug
    wrapper's helper group, a group being torn down) would shift every run.
    """
    expected = sum(count for _, count in groups_in_order)
    if expected == 0 or len(worker_tids) != expected or len(set(worker_tids)) != expected:
        return None
    ordered = sorted(worker_tids)
    workers: dict[int, str] = {}
    start = 0
    for name, count in groups_in_order:
        for tid in ordered[start : start + count]:
            workers[tid] = name
        start += count
    return workers


def _gloo_groups_in_order(rank: int) -> list[tuple[str, int]]:
    """(group name, worker threads) of this rank's gloo groups, in creation order."""
    import torch
    from torch.distributed import distributed_c10d as c10d

    found = []
    for pg, name in list(c10d._world.pg_names.items()):
        if rank not in c10d._world.pg_group_ranks.get(pg, {}):
            continue
        try:
            backend = pg._get_backend(torch.device("cpu"))
        except RuntimeError:  # no CPU backend (NCCL only)
            continue
        if type(backend).__name__ != "ProcessGroupGloo":
            continue
        threads = getattr(getattr(backend, "options", None), "_threads", None)
        if not isinstance(threads, int) or threads < 1:
            raise ValueError(f"gloo group {name!r} does not say how many worker threads it has")
        found.append((str(name), threads))
    return found


def _threads_named(name: str, task_dir: str) -> list[int]:
    tids = []
    for entry in os.listdir(task_dir):
        try:
            with open(os.path.join(task_dir, entry, "comm"), encoding="utf-8") as comm:
                if comm.read().strip() == name:
                    tids.append(int(entry))
        except (OSError, ValueError):
            continue  # the thread exited meanwhile
    return tids


def discover_gloo_workers(task_dir: str = "/proc/self/task") -> dict[int, str] | None:
    """This process's gloo worker thread id -> process-group name (see `assign_gloo_workers`);
    None without torch.distributed, without gloo groups, off Linux, or when the threads found do
    not match the groups. Call it once the threads have named themselves (the agent does, when a
    profiled window is analysed), not right after a group is created."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or not os.path.isdir(task_dir):
        return None
    try:
        groups = _gloo_groups_in_order(dist.get_rank())
    except Exception:  # private torch API: any surprise means no map, never a failed window
        return None
    if not groups:
        return None
    return assign_gloo_workers(groups, _threads_named(GLOO_WORKER_THREAD_NAME, task_dir))
