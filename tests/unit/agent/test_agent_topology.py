"""Topology: axis names from mesh dims / group descriptions, tiers from hosts, tp spanning hosts."""

from __future__ import annotations

import time

import pytest
from mfuscope.agent._topology import GroupSpec, axis_of_group, build_topology, new_incarnation

from tests.support.waiting import wait_until


@pytest.mark.parametrize(
    ("spec", "mesh_axes", "expected"),
    [
        (GroupSpec("0", "default_pg", (0, 1)), {}, "world"),
        (GroupSpec("2", "mesh_tp", (0, 1)), {}, "tp"),
        (GroupSpec("0", "default_pg", (0, 1)), {"0": "dp"}, "dp"),  # a mesh dim reusing world
        (GroupSpec("3", "dp", (0, 1)), {}, "dp"),
        (GroupSpec("4", "undefined", (0,)), {}, "pg4"),
        (GroupSpec("5", "", (0,)), {}, "pg5"),
        (GroupSpec("6", "mesh_", (0,)), {}, "mesh_"),
    ],
)
def test_axis_of_group(spec: GroupSpec, mesh_axes: dict[str, str], expected: str) -> None:
    assert axis_of_group(spec, mesh_axes) == expected


def test_tiers_and_tp_spanning_hosts() -> None:
    hosts = ["a", "a", "b", "b"]
    topology = build_topology(
        rank=1,
        local_rank=1,
        hosts=hosts,
        groups=[
            GroupSpec("0", "default_pg", (0, 1, 2, 3)),
            GroupSpec("1", "mesh_tp", (0, 1)),
            GroupSpec("2", "mesh_dp", (1, 3)),
        ],
    )
    assert topology.host == "a" and topology.world_size == 4
    assert [(g.axis, g.tier, g.spans_hosts) for g in topology.groups] == [
        ("world", "inter_node", True),
        ("tp", "intra_node", False),
        ("dp", "inter_node", True),
    ]
    assert not topology.tp_spans_hosts
    assert topology.axis_of_group_name == {"0": "world", "1": "tp", "2": "dp"}
    schema = topology.to_schema({"intra_node": 4.5e11, "inter_node": 5e10})
    assert [(g.axis, g.size, g.link_peak_bytes_per_s) for g in schema.groups] == [
        ("world", 4, 5e10),
        ("tp", 2, 4.5e11),
        ("dp", 2, 5e10),
    ]


def test_tp_group_across_hosts_is_flagged() -> None:
    topology = build_topology(
        rank=0, local_rank=0, hosts=["a", "b"], groups=[GroupSpec("1", "mesh_tp", (0, 1))]
    )
    assert topology.tp_spans_hosts
    assert topology.to_schema().tp_spans_hosts


def test_unknown_hosts_give_unknown_tier_and_duplicates_collapse() -> None:
    topology = build_topology(
        rank=0,
        local_rank=0,
        hosts=["a", None],
        groups=[GroupSpec("1", "dp", (0, 1)), GroupSpec("2", "dp", (0, 1))],
    )
    assert {g.tier for g in topology.groups} == {"unknown"}
    assert len(topology.to_schema().groups) == 1
    assert topology.host_of_rank == {0: "a"}


def test_rank_outside_world_is_refused() -> None:
    with pytest.raises(ValueError):
        build_topology(rank=2, local_rank=0, hosts=["a", "a"], groups=())


@pytest.mark.parametrize(
    ("desc", "axis"),
    [
        ("mesh_tp", "tp"),
        ("default_pg", "world"),
        ("experts", "experts"),
        ("undefined", None),
        ("", None),
        ("mesh_", "mesh_"),
    ],
)
def test_axis_from_description(desc: str, axis: str | None) -> None:
    from mfuscope.core.vocabulary import axis_from_description

    assert axis_from_description(desc) == axis


def test_incarnation_is_fresh_or_the_torchrun_launch() -> None:
    fresh = {new_incarnation({}) for _ in range(5)}
    assert len(fresh) == 5 and all(len(i) == 16 for i in fresh)
    # Without a collective to agree on one, every rank of a torchrun launch derives the same id,
    # and an elastic restart (a new restart count) a new one.
    launch = {"TORCHELASTIC_RUN_ID": "abc", "TORCHELASTIC_RESTART_COUNT": "0"}
    assert new_incarnation(launch) == new_incarnation(launch) == "abc/0"
    assert new_incarnation({**launch, "TORCHELASTIC_RESTART_COUNT": "1"}) == "abc/1"
    topology = build_topology(rank=0, local_rank=0, hosts=["a"], groups=(), incarnation="x")
    assert topology.incarnation == "x"


def test_rank_0_values_ride_the_start_up_gather_and_the_store_agreement_works() -> None:
    import torch.distributed as dist
    from mfuscope.agent._health import RateLimitedLog
    from mfuscope.agent._periodic import Periodic
    from mfuscope.agent._store_agreement import default_store_agreement
    from mfuscope.agent._topology import discover_topology

    periodic = Periodic(RateLimitedLog(60.0), clock=time.monotonic)
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        topology = discover_topology(agree=(True, 100, 10))
        assert topology.agreed == (True, 100, 10)
        agreement = default_store_agreement(topology.incarnation, periodic)
        assert agreement is not None
        agreement.publish("start/1/12", 20)
        agreement.fetch("start/1/12")
        wait_until(lambda: agreement.fetched("start/1/12") is not None, "the decision")
        assert agreement.fetched("start/1/12") == 20
        agreement.close()
    finally:
        periodic.stop(10.0)
        dist.destroy_process_group()
    assert default_store_agreement("any", periodic) is None  # no process group: no store


def test_the_agreement_talks_to_a_tcp_store_over_a_connection_of_its_own() -> None:
    from datetime import timedelta

    import torch.distributed as dist
    from mfuscope.agent._store_agreement import own_client

    server = dist.TCPStore(
        "127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=30)
    )
    wrapped = dist.PrefixStore("default_pg", dist.PrefixStore("elastic", server))
    client = own_client(wrapped)
    assert isinstance(client, dist.TCPStore) and client is not server
    assert (client.host, client.port) == (server.host, server.port)
    client.set("k", "v")
    assert server.get("k") == b"v"
    assert own_client(dist.HashStore()) is None  # nothing to connect to
