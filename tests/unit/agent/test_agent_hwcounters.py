"""The hardware-counter sampler against a fake NVML and a fake sysfs tree, clock moved by hand."""

from __future__ import annotations

import logging
import time
from pathlib import Path

import pytest
from mfuscope.agent._health import RateLimitedLog
from mfuscope.agent._hw_readers import nic_ids
from mfuscope.agent._periodic import Periodic
from mfuscope.agent.detect import detect_hardware, link_peaks
from mfuscope.agent.gpu_identity import GpuRef
from mfuscope.agent.hwcounters import HardwareSampler, build_hardware_sampler
from mfuscope.core.hwcounters import HardwareCounters, LinkPeak
from mfuscope.core.interconnects import PCIE_PER_LANE_BYTES_PER_S

from tests.support.hw_fakes import (
    NVLINK_RX,
    NVLINK_TX,
    PCIE_TX,
    CounterNvml,
    ib_port,
    net_interface,
)
from tests.support.waiting import wait_until

SW_POWER_CAP, HW_THERMAL, GPU_IDLE = 0x4, 0x40, 0x1


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _log() -> RateLimitedLog:
    return RateLimitedLog(60.0, logger=logging.getLogger("test-hw"))


def _sampler(
    nvml: CounterNvml | None, clock: Clock, root: Path | None = None, *, nics: bool = False
) -> HardwareSampler:
    return build_hardware_sampler(
        gpu=GpuRef(0) if nvml is not None else None,
        sample_nics=nics,
        log=_log(),
        nvml=nvml,
        sysfs_root=str(root) if root else "/nonexistent",
        clock=clock,
    )


def _links(record: HardwareCounters | None) -> dict[tuple[str, str], int]:
    assert record is not None
    return {(x.link, x.direction): x.bytes_total for x in record.links}


def _throttle(record: HardwareCounters | None) -> dict[str, float]:
    assert record is not None
    return {t.reason: t.seconds_total for t in record.throttle}


def test_gauges_counters_and_units() -> None:
    nvml, clock = CounterNvml(memory_percent=37, sm_mhz=990, power_mw=650_500), Clock()
    sampler = _sampler(nvml, clock)
    nvml.nvlink_kib = {"tx": 1000, "rx": 10}
    nvml.pcie_bytes = {"tx": 5_000, "rx": 7}
    nvml.energy_mj += 2_500
    clock.now += 1.0
    sampler.sample()
    record = sampler.snapshot()
    assert record is not None
    assert record.memory_busy_ratio == pytest.approx(0.37)
    assert record.sm_clock_ratio == pytest.approx(0.5)
    assert record.power_watts == pytest.approx(650.5)
    assert record.energy_joules_total == pytest.approx(2.5)
    # NVLink data counters are KiB; the PCIe counters bytes.
    assert _links(record) == {
        ("nvlink", "rx"): 10 * 1024,
        ("nvlink", "tx"): 1000 * 1024,
        ("pcie", "rx"): 7,
        ("pcie", "tx"): 5_000,
    }


def test_a_throttling_episode_is_counted_per_reason() -> None:
    nvml, clock = CounterNvml(), Clock()
    sampler = _sampler(nvml, clock)
    assert _throttle(sampler.snapshot()) == dict.fromkeys(_throttle(sampler.snapshot()), 0.0)
    for mask in (SW_POWER_CAP, SW_POWER_CAP | HW_THERMAL, GPU_IDLE, 0):
        nvml.reasons = mask
        clock.now += 1.0
        sampler.sample()
    seconds = _throttle(sampler.snapshot())
    assert seconds["sw_power_cap"] == pytest.approx(2.0)
    assert seconds["hw_thermal"] == pytest.approx(1.0)
    assert seconds["sync_boost"] == 0.0
    assert "gpu_idle" not in seconds  # an idle GPU is not a throttled one


def test_unsupported_counters_are_absent_not_zero() -> None:
    nvml = CounterNvml(
        unsupported={
            "nvmlDeviceGetTotalEnergyConsumption",
            "nvmlDeviceGetCurrentClocksEventReasons",
            "nvmlDeviceGetPcieThroughput",
            "field:138",
            "field:139",
            "field:202",
            "field:204",
            "field:197",
            "field:198",
        }
    )
    clock = Clock()
    sampler = _sampler(nvml, clock)
    clock.now += 1.0
    sampler.sample()
    record = sampler.snapshot()
    assert record is not None
    assert record.energy_joules_total is None
    assert record.links == () and record.throttle == ()
    assert record.memory_busy_ratio is not None
    calls = len(nvml.calls)
    sampler.sample()  # unsupported reads are not retried every second
    assert "nvmlDeviceGetTotalEnergyConsumption" not in nvml.calls[calls:]


def test_no_nvml_and_no_nics_is_no_record() -> None:
    sampler = _sampler(CounterNvml(unsupported={"nvmlInit"}), Clock())
    sampler.sample()
    assert sampler.snapshot() is None


def test_nvlink_byte_counters_when_the_throughput_fields_are_gone() -> None:
    nvml, clock = CounterNvml(unsupported={f"field:{NVLINK_TX}", f"field:{NVLINK_RX}"}), Clock()
    sampler = _sampler(nvml, clock)
    nvml.nvlink_kib = {"tx": 3, "rx": 1}
    sampler.sample()
    assert _links(sampler.snapshot())[("nvlink", "tx")] == 3 * 1024
    queried = nvml.field_queries[-1]
    assert NVLINK_TX not in queried and 202 in queried  # the dead fields are not asked again


def test_pcie_falls_back_to_throughput_samples() -> None:
    nvml, clock = CounterNvml(unsupported={f"field:{PCIE_TX}", "field:198"}), Clock()
    sampler = _sampler(nvml, clock)
    nvml.pcie_kb_per_s = {"tx": 2_000, "rx": 0}
    clock.now += 2.0
    sampler.sample()
    assert _links(sampler.snapshot())[("pcie", "tx")] == 4_000_000  # 2e6 B/s over 2 s


def test_a_failing_read_never_raises_and_counts_resume() -> None:
    nvml, clock = CounterNvml(), Clock()
    sampler = _sampler(nvml, clock)
    nvml.failing = {"nvmlDeviceGetFieldValues", "nvmlDeviceGetUtilizationRates"}
    nvml.nvlink_kib = {"tx": 4, "rx": 0}
    clock.now += 1.0
    sampler.sample()
    nvml.nvlink_kib = {"tx": 8, "rx": 0}
    clock.now += 1.0
    sampler.sample()
    assert _links(sampler.snapshot())[("nvlink", "tx")] == 8 * 1024


def test_energy_counter_reset_by_a_driver_reload() -> None:
    nvml, clock = CounterNvml(energy_mj=9_000_000), Clock()
    sampler = _sampler(nvml, clock)
    nvml.energy_mj = 9_001_000
    sampler.sample()
    nvml.energy_mj = 500  # reloaded: counts from zero again
    sampler.sample()
    record = sampler.snapshot()
    assert record is not None and record.energy_joules_total == pytest.approx(1.5)


def test_ib_wraparound_roce_and_ethernet(tmp_path: Path) -> None:
    clock = Clock()
    ib_port(tmp_path, "mlx5_0", xmit_words=(1 << 32) - 100, rcv_words=10)
    ib_port(tmp_path, "mlx5_1", link_layer="Ethernet", xmit_words=0)
    net_interface(tmp_path, "eth0", tx_bytes=1_000)
    net_interface(tmp_path, "veth1", tx_bytes=5, physical=False)  # virtual: not counted
    sampler = _sampler(None, clock, tmp_path, nics=True)
    sampler.sample()
    ib_port(tmp_path, "mlx5_0", xmit_words=50, rcv_words=20)  # the 32-bit counter wrapped
    ib_port(tmp_path, "mlx5_1", link_layer="Ethernet", xmit_words=1 << 33)  # 64-bit counter
    net_interface(tmp_path, "eth0", tx_bytes=3_000, rx_bytes=10)
    clock.now += 1.0
    sampler.sample()
    links = _links(sampler.snapshot())
    assert links[("ib", "tx")] == 150 * 4
    assert links[("ib", "rx")] == 10 * 4
    assert links[("roce", "tx")] == (1 << 33) * 4
    assert links[("ethernet", "tx")] == 2_000
    assert links[("ethernet", "rx")] == 10


def test_saturated_32_bit_port_is_reported_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    ib_port(tmp_path, "mlx4_0", xmit_words=(1 << 32) - 1)
    sampler = _sampler(None, Clock(), tmp_path, nics=True)
    with caplog.at_level(logging.WARNING, logger="test-hw"):
        sampler.sample()
        sampler.sample()
    assert sum("saturated" in r.getMessage() for r in caplog.records) == 1


def test_nics_are_not_sampled_unless_asked(tmp_path: Path) -> None:
    ib_port(tmp_path, "mlx5_0", xmit_words=1)
    sampler = _sampler(CounterNvml(), Clock(), tmp_path, nics=False)
    assert not {x.link for x in (sampler.snapshot() or HardwareCounters()).links} & {"ib"}


def test_snapshot_lists_peaks_only_for_links_it_counts(tmp_path: Path) -> None:
    ib_port(tmp_path, "mlx5_0")
    nvml = CounterNvml()
    info = detect_hardware(nvml=nvml, sysfs_root=tmp_path, hostname_fn=lambda: "n1")
    peaks = link_peaks(info, 0, nics=True)
    assert peaks == (
        LinkPeak("nvlink", 18 * 25e9),
        LinkPeak("pcie", 16 * PCIE_PER_LANE_BYTES_PER_S[5]),
        LinkPeak("ib", 400e9 / 8),
    )
    assert link_peaks(info, 0, nics=False) == peaks[:2]
    sampler = build_hardware_sampler(
        gpu=GpuRef(0), sample_nics=False, log=_log(), nvml=nvml, link_peaks=peaks, clock=Clock()
    )
    record = sampler.snapshot()
    assert record is not None
    assert {p.link for p in record.link_peaks} == {"nvlink", "pcie"}


def test_sampler_samples_on_its_periodic_thread_and_stops() -> None:
    nvml = CounterNvml()
    sampler = build_hardware_sampler(
        gpu=GpuRef(0), sample_nics=False, log=_log(), nvml=nvml, interval_s=0.01
    )
    periodic = Periodic(_log(), clock=time.monotonic)
    sampler.start(periodic)
    nvml.nvlink_kib = {"tx": 1, "rx": 0}
    wait_until(
        lambda: _links(sampler.snapshot()).get(("nvlink", "tx")) == 1024,
        "the periodic thread to sample",
    )
    sampler.stop()
    periodic.stop()
    assert nvml.shut_down
    assert _links(sampler.snapshot())[("nvlink", "tx")] == 1024


def test_nic_ids_name_each_nic_alike_in_every_container_of_the_node(tmp_path: Path) -> None:
    ib_port(tmp_path, "mlx5_0", node_guid="B859:9F03:00D4:4F2A")
    ib_port(tmp_path, "mlx5_1", node_guid="0000:0000:0000:0000")  # a VF never given a GUID
    ib_port(tmp_path, "mlx5_2")  # no node_guid file
    net_interface(tmp_path, "eth0", mac="08:C0:EB:11:22:33")
    net_interface(tmp_path, "eth1")
    net_interface(tmp_path, "veth9", physical=False, mac="aa:bb:cc:dd:ee:ff")
    assert nic_ids(tmp_path) == {
        "mlx5_0": "guid:b859:9f03:00d4:4f2a",
        "mlx5_1": "rdma:mlx5_1",
        "mlx5_2": "rdma:mlx5_2",
        "eth0": "mac:08:c0:eb:11:22:33",
        "eth1": "net:eth1",
    }


def test_a_rank_reads_only_the_nics_placed_on_it(tmp_path: Path) -> None:
    clock = Clock()
    ib_port(tmp_path, "mlx5_0", xmit_words=0)
    ib_port(tmp_path, "mlx5_1", xmit_words=0)
    net_interface(tmp_path, "eth0")
    sampler = build_hardware_sampler(
        gpu=None, sample_nics=("mlx5_1",), log=_log(), sysfs_root=str(tmp_path), clock=clock
    )
    sampler.sample()  # the baseline
    ib_port(tmp_path, "mlx5_0", xmit_words=1000)
    ib_port(tmp_path, "mlx5_1", xmit_words=10)
    clock.now += 1.0
    sampler.sample()
    assert _links(sampler.snapshot())[("ib", "tx")] == 40  # mlx5_1's 10 words, not mlx5_0's
    assert ("ethernet", "tx") not in _links(sampler.snapshot())
    info = detect_hardware(nvml=None, sysfs_root=tmp_path)
    both = link_peaks(info, 0, nics=True)
    one = link_peaks(info, 0, nics=("mlx5_1",))
    assert [(p.link, p.bytes_per_s) for p in both] == [("ib", 100e9)]  # two NDR ports
    assert [(p.link, p.bytes_per_s) for p in one] == [("ib", 50e9)]
    assert link_peaks(info, 0, nics=()) == ()
