"""Which machine each rank runs on: the node identity that decides tiers.

The rules are documented in docs/definitions.md#node-identity.

Every rank sends a `NodeClaim` at start (in the topology exchange); `place_ranks` (pure) turns
the claims of all ranks into one node per rank. For the whole job it uses the first of these
that *every* rank has, so identities of different kinds are never compared:

1. `node_name`: the agent's ``node_name`` option (``MFUSCOPE_NODE_NAME``), else ``NODE_NAME``,
   the name Kubernetes manifests commonly give the downward API's ``spec.nodeName``.
2. `boot_id`: the kernel's ``/proc/sys/kernel/random/boot_id``, a random id drawn at each boot
   that containers cannot change: every container on one host reads the same one, no two hosts
   share one. A VM-sandboxed container (Kata, gVisor) has its own kernel, hence its own boot id.
3. `host`: the host name; in a container that is the container's (in Kubernetes, the pod's) name,
   so two pods on one node would look like two nodes.

``/etc/machine-id`` is not used: it is a file of the container's image (absent in many, baked
into others), so containers of one image on different hosts can share it.

The host name stays a label; the node *label* is the node name when one is set, else the host
name of the node's lowest rank (on bare metal: the node's host name).

NIC counters belong to the node, not to a rank, so each NIC is sampled by one rank: a claim lists
the ids of the NICs the rank can read (an RDMA device's node GUID, a physical interface's MAC:
`mfuscope.agent._hw_readers.nic_ids`), and each (node, NIC id) goes to the lowest rank claiming
it (`Placement.nic_readers`). Two pods of one node with host networking see the same NICs, so
only the first samples them; pods given their own virtual functions (SR-IOV) see different ids
and each samples its own; two machines behind one host name have different NICs, so both are
sampled even when the host name is all that tells nodes apart.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

__all__ = [
    "BOOT_ID_PATH",
    "NODE_NAME_ENV",
    "NodeClaim",
    "Placement",
    "local_claim",
    "place_ranks",
    "read_boot_id",
]

BOOT_ID_PATH = "/proc/sys/kernel/random/boot_id"
# Second to the agent's own MFUSCOPE_NODE_NAME: the variable name Kubernetes manifests commonly
# fill from the downward API (`fieldRef: {fieldPath: spec.nodeName}`).
NODE_NAME_ENV = "NODE_NAME"
_MAX_NAME = 256  # the wire schema's label limit


@dataclass(frozen=True)
class NodeClaim:
    """What one rank says about where it runs; None where it does not know."""

    host: str | None
    node_name: str | None = None
    boot_id: str | None = None
    gpu_bus_id: str | None = None  # the rank's GPU, NVML's PCI bus id form; None without one
    nics: tuple[str, ...] = ()  # ids of the NICs whose counters this rank can read


@dataclass(frozen=True)
class Placement:
    """The node of every rank (`nodes[r]`, None = unknown), the node label of every rank, the
    kind of identity used for the whole job (``node_name``, ``boot_id`` or ``host``), the
    misconfigurations seen (one line each, for the log), and the ids of the NICs each rank
    samples (`nic_readers[r]`; empty: none)."""

    nodes: tuple[str | None, ...]
    labels: tuple[str | None, ...]
    source: str
    problems: tuple[str, ...] = ()
    nic_readers: tuple[frozenset[str], ...] = ()


def _clean(value: str | None) -> str | None:
    text = (value or "").strip()
    return text[:_MAX_NAME] if text else None


def read_boot_id(path: str = BOOT_ID_PATH) -> str | None:
    """The kernel's boot id, None where unreadable (not Linux, a restricted /proc)."""
    try:
        with open(path, encoding="ascii") as f:
            return _clean(f.read())
    except (OSError, ValueError):
        return None


def local_claim(
    *,
    node_name: str | None = None,
    environ: Mapping[str, str] | None = None,
    boot_id: Callable[[], str | None] = read_boot_id,
    hostname: Callable[[], str] = socket.gethostname,
    gpu_bus_id: str | None = None,
    nics: tuple[str, ...] = (),
) -> NodeClaim:
    """This rank's claim. `node_name` is the agent's option (argument or ``MFUSCOPE_NODE_NAME``,
    resolved by the config); without it ``NODE_NAME`` from `environ` (default `os.environ`).
    `nics`: the ids of the NICs this rank can read."""
    env = os.environ if environ is None else environ
    try:
        host = _clean(hostname())
    except OSError:
        host = None
    return NodeClaim(
        host=host,
        node_name=_clean(node_name) or _clean(env.get(NODE_NAME_ENV)),
        boot_id=boot_id(),
        gpu_bus_id=_clean(gpu_bus_id),
        nics=tuple(sorted({n for n in nics if n})),
    )


_SOURCES = ("node_name", "boot_id", "host")


def place_ranks(claims: Sequence[NodeClaim | None]) -> Placement:
    """Nodes for `claims[r]` of every rank r (None: the rank's claim is unknown)."""
    known = [c for c in claims if c is not None]
    source = next((s for s in _SOURCES if known and all(getattr(c, s) for c in known)), "host")
    nodes: list[str | None] = []
    for claim in claims:
        value = getattr(claim, source) if claim is not None else None
        # A prefix per kind, so a boot id can never equal a host or node name.
        nodes.append(f"{source}:{value}" if value else None)
    labels = _labels(claims, nodes, source)
    problems = [*_mixed_names(claims, source), *_contradictions(claims, source)]
    problems.extend(_shared_gpus(claims, nodes, labels))
    return Placement(
        tuple(nodes), tuple(labels), source, tuple(problems), _nic_readers(claims, nodes)
    )


def _nic_readers(
    claims: Sequence[NodeClaim | None], nodes: Sequence[str | None]
) -> tuple[frozenset[str], ...]:
    """For each rank, the NIC ids it is the lowest rank of its node to claim. A rank whose node
    is unknown is a node of its own (it samples what it sees rather than nobody)."""
    owner: dict[tuple[str, str], int] = {}
    scopes = [node if node is not None else f"rank:{r}" for r, node in enumerate(nodes)]
    for rank, claim in enumerate(claims):
        for nic in claim.nics if claim is not None else ():
            owner.setdefault((scopes[rank], nic), rank)
    return tuple(
        frozenset(n for n in claim.nics if owner[(scopes[rank], n)] == rank)
        if claim is not None
        else frozenset()
        for rank, claim in enumerate(claims)
    )


def _labels(
    claims: Sequence[NodeClaim | None], nodes: Sequence[str | None], source: str
) -> list[str | None]:
    if source == "node_name":
        return [c.node_name if c is not None else None for c in claims]
    first_host: dict[str, str | None] = {}
    for claim, node in zip(claims, nodes, strict=True):
        if node is not None and claim is not None:
            first_host.setdefault(node, claim.host)
    return [first_host.get(node) if node is not None else None for node in nodes]


def _ranks(ranks: Sequence[int]) -> str:
    shown = ", ".join(str(r) for r in ranks[:8])
    return shown + (f" and {len(ranks) - 8} more" if len(ranks) > 8 else "")


def _mixed_names(claims: Sequence[NodeClaim | None], source: str) -> list[str]:
    named = [r for r, c in enumerate(claims) if c is not None and c.node_name]
    unnamed = [r for r, c in enumerate(claims) if c is not None and not c.node_name]
    if not named or not unnamed:
        return []
    return [
        f"ranks {_ranks(unnamed)} have no node name (MFUSCOPE_NODE_NAME or NODE_NAME) while "
        f"ranks {_ranks(named)} have one: tiers use the {source.replace('_', ' ')} of every rank"
    ]


def _contradictions(claims: Sequence[NodeClaim | None], source: str) -> list[str]:
    """Node names the kernel's boot id contradicts (first pair of each kind)."""
    if source != "node_name":
        return []
    by_boot: dict[str, tuple[int, str]] = {}
    by_name: dict[str, tuple[int, str]] = {}
    split = joined = None
    for rank, claim in enumerate(claims):
        if claim is None or not claim.boot_id or not claim.node_name:
            continue
        other = by_boot.setdefault(claim.boot_id, (rank, claim.node_name))
        if split is None and other[1] != claim.node_name:
            split = (
                f"ranks {other[0]} and {rank} run on one kernel (boot id) but name different "
                f"nodes ({other[1]!r}, {claim.node_name!r}): a node name is wrong"
            )
        twin = by_name.setdefault(claim.node_name, (rank, claim.boot_id))
        if joined is None and twin[1] != claim.boot_id:
            joined = (
                f"ranks {twin[0]} and {rank} name node {claim.node_name!r} but run on different "
                "kernels (boot ids): a node name is wrong, or they run in VM sandboxes "
                "(Kata, gVisor)"
            )
    return [p for p in (split, joined) if p is not None]


def _shared_gpus(
    claims: Sequence[NodeClaim | None],
    nodes: Sequence[str | None],
    labels: Sequence[str | None],
) -> list[str]:
    """Ranks of one node that claim the same GPU (first such pair)."""
    seen: dict[tuple[str, str], int] = {}
    for rank, (claim, node) in enumerate(zip(claims, nodes, strict=True)):
        if claim is None or node is None or not claim.gpu_bus_id:
            continue
        first = seen.setdefault((node, claim.gpu_bus_id), rank)
        if first != rank:
            return [
                f"ranks {first} and {rank} on node {labels[rank]!r} both use GPU "
                f"{claim.gpu_bus_id}: check each rank's device selection (LOCAL_RANK, "
                "CUDA_VISIBLE_DEVICES)"
            ]
    return []
