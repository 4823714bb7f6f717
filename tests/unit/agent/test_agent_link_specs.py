"""The agent's group link specs: detection faked at its boundaries (NVML object, sysfs tree), the
specs each group ships with their source, MIG mode, and CPU runs with no invented spec."""

from __future__ import annotations

from pathlib import Path

import pytest
from mfuscope.agent._health import RateLimitedLog
from mfuscope.agent._runtime import _Device, _group_link_specs, _peak
from mfuscope.agent._topology import GroupSpec, build_topology
from mfuscope.agent.config import AgentConfig, ConfigError
from mfuscope.agent.detect import detect_hardware
from mfuscope.agent.gpu_identity import GpuRef
from mfuscope.core.schema import decode_batch

from tests.support.hw_fakes import CounterNvml, ib_port, net_interface

H100 = "NVIDIA H100 80GB HBM3"


def _two_nodes_of_eight(rank: int) -> object:
    """16 ranks on hosts a (0-7) and b (8-15): world spans both with 8 per node, tp is a node's
    ranks 0-7, dp pairs rank r with r + 8 (one rank per node)."""
    hosts = ["a"] * 8 + ["b"] * 8
    return build_topology(
        rank=rank,
        local_rank=rank % 8,
        hosts=hosts,
        groups=[
            GroupSpec("0", "default_pg", tuple(range(16))),
            GroupSpec("1", "mesh_tp", tuple(range(8))),
            GroupSpec("2", "mesh_dp", (rank % 8, rank % 8 + 8)),
        ],
    )


def test_rail_optimised_node_groups_get_the_nics_their_ranks_drive(tmp_path: Path) -> None:
    for i in range(8):  # 8 active NDR 400G ports: 50e9 bytes/s each per direction
        ib_port(tmp_path, f"mlx5_{i}")
    # the fake H100: 18 NVLink 4.0 links up
    facts = detect_hardware(nvml=CounterNvml(), sysfs_root=tmp_path, hostname_fn=lambda: "a")
    device = _Device(name=H100, use_cuda=True, links=facts.links_for(0), index=0, facts=facts)
    topology = _two_nodes_of_eight(rank=3)
    specs = _group_link_specs(AgentConfig(job="j"), device, topology)  # type: ignore[arg-type]
    # world: 8 of its ranks on node a -> min(8, 8) x 50e9 = 4e11
    assert (specs["0"].source, specs["0"].bytes_per_s) == ("sysfs", pytest.approx(4e11))
    # tp inside the node: 18 NVLink4 links x 25e9 = 4.5e11, from NVML
    assert (specs["1"].source, specs["1"].bytes_per_s) == ("nvml", pytest.approx(4.5e11))
    # dp: one rank per node drives one NIC, 5e10
    assert (specs["2"].source, specs["2"].bytes_per_s) == ("sysfs", pytest.approx(5e10))
    wire = topology.to_schema(group_specs=specs)  # type: ignore[attr-defined]
    assert [(g.axis, g.link_peak_bytes_per_s, g.link_peak_source) for g in wire.groups] == [
        ("world", pytest.approx(4e11), "sysfs"),
        ("tp", pytest.approx(4.5e11), "nvml"),
        ("dp", pytest.approx(5e10), "sysfs"),
    ]


def test_cpu_gloo_run_ships_unknown_specs_and_user_settings_replace_them() -> None:
    topology = _two_nodes_of_eight(rank=0)
    cpu = _Device(name="cpu", use_cuda=False, links=None)
    specs = _group_link_specs(AgentConfig(job="j"), cpu, topology)  # type: ignore[arg-type]
    assert {(s.source, s.bytes_per_s) for s in specs.values()} == {("unknown", None)}
    stated = AgentConfig(job="j", nic_bytes_per_s=12.5e9, nic_count=4)
    specs = _group_link_specs(stated, cpu, topology)  # type: ignore[arg-type]
    # world, 8 ranks on the node, 4 stated NICs of 12.5e9: min(8, 4) x 12.5e9 = 5e10
    assert (specs["0"].source, specs["0"].bytes_per_s) == ("user", pytest.approx(5e10))
    assert specs["1"].source == "unknown"  # no intra-node rate stated
    with pytest.raises(ConfigError, match="nic_count"):
        AgentConfig(job="j", nic_count=0)


def test_unknown_specs_travel_on_the_wire_without_a_rate() -> None:
    topology = _two_nodes_of_eight(rank=0)
    cpu = _Device(name="cpu", use_cuda=False, links=None)
    specs = _group_link_specs(AgentConfig(job="j"), cpu, topology)  # type: ignore[arg-type]
    groups = topology.to_schema(group_specs=specs).groups  # type: ignore[attr-defined]
    body = (
        '{"schema": "mfuscope.report", "version": "1.1", "job": "j", "rank": 0, '
        '"world_size": 16, "host": "a", "device": "cpu", "peak_flops": null, '
        '"peak_source": "unknown", "sent_unix_ns": 1, "reports": [], "topology": {"groups": ['
        + ", ".join(
            f'{{"axis": "{g.axis}", "tier": "{g.tier}", "size": {g.size}, '
            f'"spans_hosts": {str(g.spans_hosts).lower()}, "link_peak_source": "unknown"}}'
            for g in groups
        )
        + "]}}"
    )
    batch = decode_batch(body)
    assert batch.topology is not None
    assert {(g.link_peak_bytes_per_s, g.link_peak_source) for g in batch.topology.groups} == {
        (None, "unknown")
    }


def test_plain_ethernet_from_sys_class_net_when_no_rdma_port(tmp_path: Path) -> None:
    for name, speed, state, physical in (
        ("eth0", "100000", "up", True),  # 100 GbE: 100000 Mb/s -> 12.5e9 bytes/s
        ("eth1", "25000", "down", True),  # down: not usable
        ("lo", "-1", "unknown", False),  # virtual: no device link
    ):
        path = net_interface(tmp_path, name, physical=physical)
        (path / "speed").write_text(speed + "\n")
        (path / "operstate").write_text(state + "\n")
    facts = detect_hardware(nvml=CounterNvml(name="NVIDIA L40S"), sysfs_root=tmp_path)
    links = facts.links_for(0)
    assert (links.nic_rates_bits_per_s, links.nic_kind) == ((100e9,), "ethernet")
    device = _Device(name="NVIDIA L40S", use_cuda=True, links=links, facts=facts)
    topology = _two_nodes_of_eight(rank=0)
    specs = _group_link_specs(AgentConfig(job="j"), device, topology)  # type: ignore[arg-type]
    # one port on the node: min(8, 1) x 12.5e9
    assert (specs["0"].source, specs["0"].bytes_per_s) == ("sysfs", pytest.approx(12.5e9))


def test_nvml_mig_mode_makes_the_peak_a_slice_peak(tmp_path: Path) -> None:
    facts = detect_hardware(nvml=CounterNvml(mig_mode=(1, 1)), sysfs_root=tmp_path)
    assert facts.gpus[0].mig_enabled
    log = RateLimitedLog(60.0)
    config = AgentConfig(job="j", dtype="bf16")
    # the name carries no profile: unknown, not the whole H100's 989.4 TFLOP/s
    plain = _Device(name=H100, use_cuda=True, links=None, facts=facts, gpu=GpuRef(0))
    assert _peak(config, plain, log) == (None, "unknown")
    # with the profile in the name (as CUDA names a MIG device): 3/7 of 989.4e12
    sliced = _Device(
        name=H100 + " MIG 3g.40gb", use_cuda=True, links=None, facts=facts, gpu=GpuRef(0)
    )
    peak, source = _peak(config, sliced, log)
    assert source == "spec" and peak == pytest.approx(989.4e12 * 3 / 7)
    no_mig = detect_hardware(nvml=CounterNvml(), sysfs_root=tmp_path)
    assert not no_mig.gpus[0].mig_enabled
