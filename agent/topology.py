"""Who this rank is and whom it talks to, discovered once at start.

`discover_topology` (torch side) gathers every rank's host name with one `all_gather_object` and
lists the process groups this rank belongs to; the same collective hands every rank rank 0's
fresh random *incarnation* (this launch's id: a relaunch after a crash gets a new one).
`build_topology` (pure) names each group's axis and tier:

- axis: the DeviceMesh dim name when the group is one of the mesh's dims; else the group
  description (`mesh_<name>` -> `<name>`, `default_pg` -> `world`, as the engine names groups in
  traces); else `pg<name>`.
- tier: `intra_node` when all the group's ranks share one host, else `inter_node`
  (`unknown` when a rank's host is unknown). A `tp` group on several hosts is flagged: tensor
  parallelism has spilled past the NVLink boundary (docs/definitions.md#tp-spanning-hosts).
"""

from __future__ import annotations

import dataclasses
import os
import secrets
import socket
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from mfuscope.core.schema import GroupInfo, Topology
from mfuscope.core.vocabulary import TENSOR_AXIS, axis_from_description

__all__ = [
    "GroupSpec",
    "GroupView",
    "RankTopology",
    "axis_of_group",
    "build_topology",
    "discover_topology",
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

    @property
    def spans_hosts(self) -> bool:
        return len(self.hosts) > 1


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
    # Rank 0's `agree` values from `discover_topology` (None: the ranks could not agree).
    agreed: tuple[Any, ...] | None = None

    @property
    def axis_of_group_name(self) -> dict[str, str]:
        """Process-group name -> axis, for the engine's axis overrides."""
        return {g.name: g.axis for g in self.groups}

    @property
    def tp_spans_hosts(self) -> bool:
        return any(g.axis == TENSOR_AXIS and g.spans_hosts for g in self.groups)

    def to_schema(self, link_peak_bytes_per_s: Mapping[str, float] | None = None) -> Topology:
        """The wire `Topology`: one entry per distinct (axis, tier, size, spans_hosts).

        `link_peak_bytes_per_s` maps a tier to its unidirectional spec rate, when known.
        """
        peaks = link_peak_bytes_per_s or {}
        seen: dict[tuple[str, str, int, bool], GroupInfo] = {}
        for g in self.groups:
            key = (g.axis, g.tier, len(g.ranks), g.spans_hosts)
            seen.setdefault(
                key,
                GroupInfo(
                    axis=g.axis,
                    tier=g.tier,
                    size=len(g.ranks),
                    spans_hosts=g.spans_hosts,
                    link_peak_bytes_per_s=peaks.get(g.tier),
                ),
            )
        return Topology(groups=tuple(seen.values()))


def axis_of_group(spec: GroupSpec, mesh_axes: Mapping[str, str]) -> str:
    """The axis name of a group (see the module docstring for the rules)."""
    if spec.name in mesh_axes:
        return mesh_axes[spec.name]
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
) -> RankTopology:
    """Name axes and tiers of `groups` given the host of every rank (`hosts[r]`, None = unknown).

    Raises ValueError when `rank` is not a valid index into `hosts`.
    """
    if not 0 <= rank < len(hosts):
        raise ValueError(f"rank {rank} outside a world of {len(hosts)}")
    axes = mesh_axes or {}
    host_of_rank = {r: h for r, h in enumerate(hosts) if h}
    views = []
    for spec in groups:
        group_hosts = [hosts[r] if 0 <= r < len(hosts) else None for r in spec.ranks]
        known = sorted({h for h in group_hosts if h})
        if any(h is None for h in group_hosts):
            tier = "unknown"
        else:
            tier = "intra_node" if len(known) <= 1 else "inter_node"
        views.append(
            GroupView(
                name=spec.name,
                desc=spec.desc,
                ranks=tuple(spec.ranks),
                axis=axis_of_group(spec, axes),
                tier=tier,
                hosts=tuple(known),
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
    )


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


def discover_topology(mesh: Any = None, agree: tuple[Any, ...] | None = None) -> RankTopology:
    """Rank, local rank, host of every rank, groups and the launch's incarnation; collective on
    the default group. Rank 0's `agree` values ride along and come back as `agreed` on every
    rank (the profiled-window schedule's parameters).

    Every rank must call it (the Agent does, at construction). Without torch.distributed
    initialised it describes a single process from the `RANK`/`LOCAL_RANK` environment.
    """
    import torch.distributed as dist

    host = socket.gethostname()
    if not (dist.is_available() and dist.is_initialized()):
        rank = _env_int("RANK", 0)
        world = max(_env_int("WORLD_SIZE", 1), rank + 1)
        hosts: list[str | None] = [None] * world
        hosts[rank] = host
        alone = build_topology(
            rank=rank,
            local_rank=_env_int("LOCAL_RANK", 0),
            hosts=hosts,
            groups=(),
            incarnation=new_incarnation(),
        )
        return dataclasses.replace(alone, agreed=agree if world == 1 else None)
    rank = dist.get_rank()
    world = dist.get_world_size()
    gathered: list[Any] = [None] * world
    # One collective for all: every rank's host, rank 0's id for this launch and its `agree`.
    dist.all_gather_object(gathered, (host, secrets.token_hex(8), agree))
    hosts = [_host_of(entry) for entry in gathered]
    incarnation = _incarnation_of(gathered[0])
    same_host_before = sum(1 for r in range(rank) if hosts[r] == host)
    local_rank = _env_int("LOCAL_RANK", same_host_before)
    topology = build_topology(
        rank=rank,
        local_rank=local_rank,
        hosts=hosts,
        groups=_process_groups(dist, rank),
        mesh_axes=_mesh_axes(mesh) if mesh is not None else None,
        incarnation=incarnation,
    )
    return dataclasses.replace(topology, agreed=_agreed_of(gathered[0]))


def _host_of(entry: Any) -> str | None:
    host = entry[0] if isinstance(entry, tuple) and entry else None
    return host if isinstance(host, str) and host else None


def _agreed_of(entry: Any) -> tuple[Any, ...] | None:
    value = entry[2] if isinstance(entry, tuple) and len(entry) > 2 else None
    return value if isinstance(value, tuple) else None


def _incarnation_of(entry: Any) -> str:
    value = entry[1] if isinstance(entry, tuple) and len(entry) > 1 else None
    return value if isinstance(value, str) and value else new_incarnation()
