"""Hardware counters end to end: an Agent with a fake NVML and a fake sysfs tree feeds the real
collector over HTTP (in-process aiohttp server on port 0), and /metrics serves the contract series,
through a clock-throttling episode and a 32-bit InfiniBand counter wrapping around."""

from __future__ import annotations

import asyncio
import threading
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from mfuscope.agent import Agent
from mfuscope.agent._agent import Seams, agent_with_seams
from mfuscope.collector import Aggregator, StateConfig
from mfuscope.collector._routes import Routes
from mfuscope.collector._server import bind_socket, serve_until
from prometheus_client.parser import text_string_to_metric_families

from tests.support.hw_fakes import CounterNvml, ib_port

pytestmark = pytest.mark.slow  # a real collector over HTTP

SW_POWER_CAP, HW_THERMAL = 0x4, 0x40


class _Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def collector_url() -> Iterator[str]:
    loop = asyncio.new_event_loop()
    stop = asyncio.Event()
    started = threading.Event()
    address: list[tuple[str, int]] = []

    def on_started(where: tuple[str, int]) -> None:
        address.append(where)
        started.set()

    routes = Routes(Aggregator(StateConfig()), token=None)
    coroutine = serve_until(routes, bind_socket("127.0.0.1", 0), stop, on_started)
    thread = threading.Thread(target=loop.run_until_complete, args=(coroutine,))
    thread.start()
    assert started.wait(30)
    host, port = address[0]
    try:
        yield f"http://{host}:{port}"
    finally:
        loop.call_soon_threadsafe(stop.set)
        thread.join(30)
        loop.close()


def _scrape(url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    with urllib.request.urlopen(f"{url}/metrics", timeout=10) as response:
        text = response.read().decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name.startswith(("mfuscope_device_", "mfuscope_link_"))
    }


def _agent(url: str, nvml: CounterNvml, root: Path, clock: _Clock) -> Agent:
    return agent_with_seams(
        Seams(nvml=nvml, sysfs_root=str(root), clock=clock),
        job="hw",
        collector_url=url,
        flops_per_step=1e6,
        peak_flops=1e11,
        profile=False,
        flush_interval_s=0.05,
        hardware_interval_s=3600.0,  # the test samples by hand, between steps
    )


def test_counters_reach_prometheus_through_the_real_collector(
    collector_url: str, tmp_path: Path
) -> None:
    nvml, clock = CounterNvml(memory_percent=20, sm_mhz=1980), _Clock()
    ib_port(tmp_path, "mlx5_0", xmit_words=(1 << 32) - 1_000, rcv_words=0)
    agent = _agent(collector_url, nvml, tmp_path, clock)
    sampler = agent._runtime.hardware if agent._runtime else None
    assert sampler is not None
    weight = torch.randn(32, 32, requires_grad=True)
    # (NVML clock-event mask, SM MHz) per second: a two-second power-cap episode that turns
    # thermal for one of them, then recovery.
    episode = [(0, 1980), (SW_POWER_CAP, 1400), (SW_POWER_CAP | HW_THERMAL, 1200), (0, 1980)]
    for second, (mask, mhz) in enumerate(episode):
        with agent.step():
            (torch.randn(8, 32) @ weight).sum().backward()
        nvml.reasons, nvml.sm_mhz = mask, mhz
        nvml.memory_percent = 60
        nvml.nvlink_kib = {"tx": 1_000 * (second + 1), "rx": 500 * (second + 1)}
        nvml.energy_mj += 700_000  # 700 W for a second
        # The 32-bit port counter wraps between the first and second sample.
        ib_port(tmp_path, "mlx5_0", xmit_words=((1 << 32) - 1_000 + 400 * (second + 1)) % (1 << 32))
        clock.now += 1.0
        sampler.sample()
    agent.close()

    values = _scrape(collector_url)
    job = (("job", "hw"),)

    def link(kind: str, direction: str) -> float:
        return values[
            ("mfuscope_link_bytes_total", (("direction", direction), ("job", "hw"), ("link", kind)))
        ]

    def throttled(reason: str) -> float:
        return values[
            ("mfuscope_device_clock_throttle_seconds_total", (("job", "hw"), ("reason", reason)))
        ]

    assert link("nvlink", "tx") == 4_000 * 1024
    assert link("nvlink", "rx") == 2_000 * 1024
    assert link("ib", "tx") == 4 * 400 * 4  # across the wrap: 1,600 words of 4 bytes
    assert link("ib", "rx") == 0.0  # a counter that is read and idle is a real zero
    assert throttled("sw_power_cap") == pytest.approx(2.0)
    assert throttled("hw_thermal") == pytest.approx(1.0)
    assert throttled("sync_boost") == 0.0
    assert values[("mfuscope_device_energy_joules_total", job)] == pytest.approx(2_800.0)
    assert values[("mfuscope_device_memory_busy_ratio", job)] == pytest.approx(0.6)
    assert values[("mfuscope_device_sm_clock_ratio", job)] == pytest.approx(1.0)
    peak = ("mfuscope_link_peak_bandwidth_bytes_per_second", (("job", "hw"), ("link", "ib")))
    assert values[peak] == 50e9  # one 400 Gb/s port


def test_no_nvml_no_nics_no_series(collector_url: str, tmp_path: Path) -> None:
    nvml = CounterNvml(unsupported={"nvmlInit"})
    agent = _agent(collector_url, nvml, tmp_path, _Clock())
    with agent.step():
        pass
    agent.close()
    assert _scrape(collector_url) == {}
