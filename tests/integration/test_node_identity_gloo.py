"""Real 2-rank gloo jobs on this one machine: tiers follow the node identity, not host names.

- Both ranks share the host name but are told ``MFUSCOPE_NODE_NAME=n0`` / ``n1``: the world group
  is inter-node, and rank 0 reports once that the kernel's boot id says otherwise.
- Each rank runs in its own UTS namespace with its own host name (as two pods on one node do),
  no node name set: the shared kernel boot id puts both on one node, so the group is intra-node.

Both ranks are local rank 0 (each "pod" or "node" runs its own launcher) and see the same fake
node's NICs (a sysfs tree): on one node only rank 0 samples them, on two nodes both do.
"""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import pytest
from mfuscope.core.schema import ReportBatch, decode_batch

from tests.support.hw_fakes import ib_port
from tests.support.launch import job_env
from tests.support.processes import free_port

JOB = Path(__file__).resolve().parents[1] / "support" / "node_identity_job.py"
UNSHARE = ["unshare", "--uts", "--map-root-user"]


def _run(
    tmp_path: Path, env_of_rank: list[dict[str, str]], prefix_of_rank: list[list[str]]
) -> tuple[list[ReportBatch], list[str]]:
    """Run the two ranks; returns the last batch of each rank and each rank's output."""
    base = {
        k: v
        for k, v in job_env(tmp_path / "tmp").items()
        if k not in ("NODE_NAME", "RANK", "LOCAL_RANK")
    }
    base |= {
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(free_port()),
        "WORLD_SIZE": "2",
        # gloo binds to the address of the host name by default; under another host name that
        # name resolves nowhere.
        "GLOO_SOCKET_IFNAME": "lo",
    }
    sysfs = tmp_path / "node"
    ib_port(sysfs, "mlx5_0", node_guid="b859:9f03:00d4:4f2a")
    procs = []
    for rank in range(2):
        env = base | {"RANK": str(rank), "LOCAL_RANK": "0"} | env_of_rank[rank]
        out = tmp_path / f"rank{rank}.jsonl"
        command = [*prefix_of_rank[rank], sys.executable, str(JOB), "--jsonl", str(out)]
        command += ["--sysfs-root", str(sysfs)]
        procs.append(
            subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        )
    outputs = []
    for proc in procs:
        try:
            output, _ = proc.communicate(timeout=120)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        outputs.append(output.decode(errors="replace"))
        assert proc.returncode == 0, outputs[-1]
    batches = []
    for rank in range(2):
        lines = (tmp_path / f"rank{rank}.jsonl").read_text().splitlines()
        batches.append(decode_batch(lines[-1]))
    return batches, outputs


def _nic_samplers(batches: list[ReportBatch]) -> list[int]:
    """The ranks whose batches carry the node's InfiniBand counters."""
    return [
        b.rank
        for b in batches
        if b.hardware is not None and any(x.link == "ib" for x in b.hardware.links)
    ]


def _world_tiers(batches: list[ReportBatch]) -> list[tuple[str, bool]]:
    tiers = []
    for batch in batches:
        assert batch.topology is not None
        (world,) = [g for g in batch.topology.groups if g.axis == "world"]
        tiers.append((world.tier, world.spans_hosts))
    return tiers


@pytest.mark.slow
def test_node_names_make_one_host_two_nodes(tmp_path: Path) -> None:
    env = [{"MFUSCOPE_NODE_NAME": "n0"}, {"MFUSCOPE_NODE_NAME": "n1"}]
    batches, outputs = _run(tmp_path, env, [[], []])
    assert batches[0].host == batches[1].host == socket.gethostname()
    assert [b.node for b in batches] == ["n0", "n1"]
    assert _world_tiers(batches) == [("inter_node", True), ("inter_node", True)]
    assert _nic_samplers(batches) == [0, 1]  # two nodes: each samples its NICs
    # Same kernel, different node names: reported once, by rank 0.
    assert "name different nodes" in outputs[0]
    assert "name different nodes" not in outputs[1]


def _unshare_works() -> bool:
    try:
        done = subprocess.run([*UNSHARE, "true"], capture_output=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0


@pytest.mark.slow
@pytest.mark.skipif(not _unshare_works(), reason="needs unshare --uts --map-root-user")
def test_two_pods_on_one_node_share_it_by_boot_id(tmp_path: Path) -> None:
    prefixes = [
        [*UNSHARE, "sh", "-c", f'hostname pod-{rank} && exec "$@"', "sh"] for rank in range(2)
    ]
    batches, _ = _run(tmp_path, [{}, {}], prefixes)
    assert [b.host for b in batches] == ["pod-0", "pod-1"]
    # Both on the node of rank 0 (the node label is its host name), one tier: intra-node.
    assert [b.node for b in batches] == ["pod-0", "pod-0"]
    assert _world_tiers(batches) == [("intra_node", False), ("intra_node", False)]
    # Two pods, each with its local rank 0, on one node: its NICs are sampled once.
    assert _nic_samplers(batches) == [0]
