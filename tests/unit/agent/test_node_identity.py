"""Node identity: which ranks share a node (tiers), from node names, boot ids or host names."""

from __future__ import annotations

from pathlib import Path

import pytest
from mfuscope.agent._node_identity import NodeClaim, local_claim, place_ranks, read_boot_id
from mfuscope.agent._topology import GroupSpec, build_topology
from mfuscope.agent.config import AgentConfig

BOOT_A = "04fa870c-3a9b-49a6-b5dd-3a5e3995ff92"
BOOT_B = "9a1d44e2-0b6c-4a51-8f3e-2c1f6a7b8d90"
WORLD = GroupSpec("0", "default_pg", (0, 1))


def _claim(env: dict[str, str], *, node_name: str | None = None) -> NodeClaim:
    return local_claim(
        node_name=node_name, environ=env, boot_id=lambda: BOOT_A, hostname=lambda: "pod-0"
    )


def test_node_name_precedence() -> None:
    # The agent's option (argument or MFUSCOPE_NODE_NAME, resolved by the config) wins over
    # NODE_NAME; blank values count as unset.
    env = {"NODE_NAME": "from-downward-api"}
    assert _claim(env, node_name="given").node_name == "given"
    assert _claim(env).node_name == "from-downward-api"
    assert _claim({"NODE_NAME": "  "}).node_name is None
    assert _claim(env, node_name=" ").node_name == "from-downward-api"
    claim = _claim({})
    assert (claim.node_name, claim.boot_id, claim.host) == (None, BOOT_A, "pod-0")


def test_mfuscope_node_name_reaches_the_config_before_node_name() -> None:
    env = {"MFUSCOPE_JOB": "j", "MFUSCOPE_NODE_NAME": "gpu-node-7", "NODE_NAME": "other"}
    config = AgentConfig.resolve({}, env)
    assert config.node_name == "gpu-node-7"
    assert _claim(env, node_name=config.node_name).node_name == "gpu-node-7"
    assert AgentConfig.resolve({"node_name": "arg"}, env).node_name == "arg"


def test_two_pods_on_one_node_are_intra_node() -> None:
    # Host name = pod name, so the hosts differ; the kernel's boot id is the node's.
    claims = [NodeClaim("trainer-0", boot_id=BOOT_A), NodeClaim("trainer-1", boot_id=BOOT_A)]
    placement = place_ranks(claims)
    assert placement.source == "boot_id" and placement.problems == ()
    topology = build_topology(
        rank=1, local_rank=0, hosts=["trainer-0", "trainer-1"], groups=[WORLD], placement=placement
    )
    assert [(g.tier, g.spans_hosts) for g in topology.groups] == [("intra_node", False)]
    # The host name stays a label; the node label is the node's lowest rank's host.
    assert (topology.host, topology.node, topology.node_source) == (
        "trainer-1",
        "trainer-0",
        "boot_id",
    )
    assert topology.node_of_rank[0] == topology.node_of_rank[1]
    # Without placement (host names alone) the same pods were inter-node: the old behaviour.
    by_host = build_topology(rank=1, local_rank=0, hosts=["trainer-0", "trainer-1"], groups=[WORLD])
    assert by_host.groups[0].tier == "inter_node"


def test_node_names_decide_over_host_names_and_boot_ids() -> None:
    # Two ranks on one machine (same host, same kernel) told they are on two nodes: the names
    # win, and the contradiction is reported once.
    claims = [
        NodeClaim("box", node_name="n0", boot_id=BOOT_A),
        NodeClaim("box", node_name="n1", boot_id=BOOT_A),
    ]
    placement = place_ranks(claims)
    assert placement.source == "node_name"
    assert placement.labels == ("n0", "n1")
    assert len(placement.problems) == 1 and "name different nodes" in placement.problems[0]
    topology = build_topology(
        rank=0, local_rank=0, hosts=["box", "box"], groups=[WORLD], placement=placement
    )
    assert topology.groups[0].tier == "inter_node" and topology.node == "n0"


def test_boot_ids_tell_hosts_apart_and_a_shared_node_name_on_two_kernels_is_reported() -> None:
    placement = place_ranks([NodeClaim("a", boot_id=BOOT_A), NodeClaim("a", boot_id=BOOT_B)])
    assert placement.nodes[0] != placement.nodes[1]  # same host name, two machines
    joined = place_ranks(
        [
            NodeClaim("p0", node_name="n", boot_id=BOOT_A),
            NodeClaim("p1", node_name="n", boot_id=BOOT_B),
        ]
    )
    assert joined.nodes[0] == joined.nodes[1]
    assert len(joined.problems) == 1 and "VM sandboxes" in joined.problems[0]


@pytest.mark.parametrize(
    ("claims", "source"),
    [
        # One rank without a node name: boot ids for everyone, and it is reported.
        ([NodeClaim("p0", "n0", BOOT_A), NodeClaim("p1", None, BOOT_A)], "boot_id"),
        # One rank without a readable boot id: host names for everyone.
        ([NodeClaim("p0", None, BOOT_A), NodeClaim("p1", None, None)], "host"),
        ([NodeClaim("p0", "n0", BOOT_A), NodeClaim("p1", "n1", BOOT_B)], "node_name"),
    ],
)
def test_one_kind_of_identity_for_the_whole_job(claims: list[NodeClaim], source: str) -> None:
    placement = place_ranks(claims)
    assert placement.source == source
    assert all(node is not None and node.startswith(f"{source}:") for node in placement.nodes)
    mixed = source == "boot_id"
    assert any("have no node name" in p for p in placement.problems) is mixed


def test_two_ranks_claiming_one_gpu_are_reported_not_fatal() -> None:
    bus = "00000000:3B:00.0"
    claims = [
        NodeClaim("h", boot_id=BOOT_A, gpu_bus_id=bus),
        NodeClaim("h", boot_id=BOOT_A, gpu_bus_id="00000000:5D:00.0"),
        NodeClaim("h", boot_id=BOOT_A, gpu_bus_id=bus),
        NodeClaim("g", boot_id=BOOT_B, gpu_bus_id=bus),  # another node: its own GPU
    ]
    problems = place_ranks(claims).problems
    assert len(problems) == 1
    assert "ranks 0 and 2" in problems[0] and bus in problems[0]


def test_unknown_claims_give_unknown_tiers() -> None:
    placement = place_ranks([NodeClaim("a", boot_id=BOOT_A), None])
    assert placement.nodes[1] is None and placement.source == "boot_id"
    topology = build_topology(
        rank=0, local_rank=0, hosts=["a", None], groups=[WORLD], placement=placement
    )
    assert topology.groups[0].tier == "unknown"


def test_boot_id_file(tmp_path: Path) -> None:
    path = tmp_path / "boot_id"
    path.write_text(BOOT_A + "\n")
    assert read_boot_id(str(path)) == BOOT_A
    assert read_boot_id(str(tmp_path / "missing")) is None


# The NICs a rank can read, by id: two HCAs and a physical Ethernet port (host networking).
NODE_NICS = ("guid:b859:9f03:00d4:4f2a", "guid:b859:9f03:00d4:4f2b", "mac:08:c0:eb:11:22:33")
NIC_NAMES = dict(zip(("mlx5_0", "mlx5_1", "eth0"), NODE_NICS, strict=True))


def _sampled(claims: list[NodeClaim], local_ranks: list[int]) -> list[tuple[str, ...]]:
    """The NIC device names each rank's sampler reads (`RankTopology.nics_sampled`)."""
    placement = place_ranks(claims)
    hosts = [c.host for c in claims]
    return [
        build_topology(
            rank=rank, local_rank=local, hosts=hosts, groups=[], placement=placement
        ).nics_sampled(NIC_NAMES)
        for rank, local in enumerate(local_ranks)
    ]


def test_two_pods_on_one_node_sample_its_nics_once() -> None:
    # Two pods of 2 ranks with host networking: both pods' local rank 0 see the node's NICs.
    claims = [NodeClaim(f"pod-{r // 2}", boot_id=BOOT_A, nics=NODE_NICS) for r in range(4)]
    assert _sampled(claims, [0, 1, 0, 1]) == [("mlx5_0", "mlx5_1", "eth0"), (), (), ()]


def test_two_nodes_each_sample_their_own_nics() -> None:
    boots = [BOOT_A, BOOT_A, BOOT_B, BOOT_B]
    claims = [NodeClaim(f"node-{r // 2}", boot_id=b, nics=NODE_NICS) for r, b in enumerate(boots)]
    all_nics = ("mlx5_0", "mlx5_1", "eth0")
    assert _sampled(claims, [0, 1, 0, 1]) == [all_nics, (), all_nics, ()]


def test_pods_with_their_own_virtual_functions_each_sample_theirs() -> None:
    # SR-IOV: each pod sees its own VF (its own GUID); the node's other NICs are not visible.
    claims = [
        NodeClaim("pod-0", boot_id=BOOT_A, nics=(NODE_NICS[0],)),
        NodeClaim("pod-1", boot_id=BOOT_A, nics=(NODE_NICS[1],)),
    ]
    assert _sampled(claims, [0, 0]) == [("mlx5_0",), ("mlx5_1",)]


def test_two_machines_behind_one_host_name_both_sample() -> None:
    # No boot id (a restricted /proc): the host name is all that places ranks, and both machines
    # are called "trainer"; their HCAs still differ, so neither machine goes uncounted.
    claims = [
        NodeClaim("trainer", nics=(NODE_NICS[0],)),
        NodeClaim("trainer", nics=(NODE_NICS[1],)),
    ]
    placement = place_ranks(claims)
    assert placement.source == "host" and placement.nodes[0] == placement.nodes[1]
    assert _sampled(claims, [0, 0]) == [("mlx5_0",), ("mlx5_1",)]


def test_without_the_jobs_claims_local_rank_zero_samples() -> None:
    # No placement (the agent could not gather claims): the old rule stands in.
    for local, expected in ((0, ("mlx5_0", "mlx5_1", "eth0")), (1, ())):
        topology = build_topology(rank=local, local_rank=local, hosts=["a", "a"], groups=[])
        assert topology.nics_read is None
        assert topology.nics_sampled(NIC_NAMES) == expected
    claim = local_claim(
        boot_id=lambda: BOOT_A, hostname=lambda: "a", nics=(NODE_NICS[1], "", NODE_NICS[0])
    )
    assert claim.nics == (NODE_NICS[0], NODE_NICS[1])  # sorted, blanks dropped
