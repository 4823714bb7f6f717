"""Faults: collector absent, hanging, answering 500, and a failing profiler.

In every case the job finishes, the training thread never waits on telemetry (the time the
agent spends per step stays far below the collector timeouts), the failure is counted, and it
is logged once per interval rather than once per attempt.
"""

from __future__ import annotations

import json
import logging
import statistics
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from mfuscope.agent import Agent
from mfuscope.agent._agent import Seams, agent_with_seams

from tests.support import agent_helpers as helpers

pytestmark = pytest.mark.slow  # real HTTP servers and agent threads on the wall clock

REQUEST_TIMEOUT_S = 1.0
STEPS = 150


def _train_step(weight: torch.Tensor) -> None:
    (torch.randn(64, 64) @ weight).sum().backward()


def _run(agent: Agent) -> list[float]:
    """Run steps; return the time spent in agent code per step (s), training excluded."""
    weight = torch.randn(64, 64, requires_grad=True)
    overhead = []
    for _ in range(STEPS):
        t0 = time.perf_counter()
        with agent.step():
            t1 = time.perf_counter()
            _train_step(weight)
            t2 = time.perf_counter()
        overhead.append((t1 - t0) + (time.perf_counter() - t2))
    return overhead


def _agent(url: str, **options: Any) -> Agent:
    settings: dict[str, Any] = {
        "job": "faults",
        "collector_url": url,
        "peak_flops": 1e11,
        "flops_per_step": 1e6,
        "profile": False,
        "flush_interval_s": 0.01,
        "max_batch_reports": 16,
        "retry_base_s": 0.01,
        "retry_max_s": 0.05,
        "max_send_attempts": 2,
        "request_timeout_s": REQUEST_TIMEOUT_S,
    }
    settings.update(options)
    return Agent(**settings)


@pytest.fixture
def collector(request: pytest.FixtureRequest) -> Iterator[str]:
    kind = request.param
    if kind == "absent":
        yield helpers.closed_port_url()
        return
    server = helpers.HangingCollector() if kind == "hanging" else helpers.StubCollector(status=500)
    try:
        yield server.url
    finally:
        server.close()


@pytest.mark.parametrize("collector", ["absent", "hanging", "error500"], indirect=True)
def test_collector_faults_never_reach_the_training_loop(
    collector: str, caplog: pytest.LogCaptureFixture
) -> None:
    agent = _agent(collector)
    with caplog.at_level(logging.WARNING, logger="mfuscope.agent"):
        overhead = _run(agent)
        started = time.perf_counter()
        agent.close(timeout_s=1.5)
        close_s = time.perf_counter() - started
    health = agent.health.snapshot()
    assert health.send_failures_total >= 1
    assert health.reports_dropped_total >= 1
    # a blocked training thread would show up as ~REQUEST_TIMEOUT_S on some step
    assert statistics.median(overhead) < 0.002, statistics.median(overhead)
    assert max(overhead) < REQUEST_TIMEOUT_S / 4, max(overhead)
    assert close_s < 1.5 + REQUEST_TIMEOUT_S
    send_logs = [r for r in caplog.records if "failed (attempt" in r.getMessage()]
    assert len(send_logs) == 1, [r.getMessage() for r in send_logs]


def test_failing_profiler_is_counted_and_logged_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    starts = []

    class FailingProfiler:
        def start(self) -> None:
            starts.append(1)
            raise RuntimeError("injected profiler failure")

        def stop(self) -> None:
            return None

        def export_chrome_trace(self, path: str) -> None:
            return None

    agent = agent_with_seams(
        Seams(profiler_factory=FailingProfiler),
        job="faults",
        jsonl_path=str(tmp_path / "out.jsonl"),
        peak_flops=1e11,
        flops_per_step=1e6,
        profile_first_step=2,
        profile_every_steps=20,
        profile_steps=2,
        profile_max_overhead_ratio=1.0,
    )
    with caplog.at_level(logging.WARNING, logger="mfuscope.agent"):
        overhead = _run(agent)
        agent.close()
    health = agent.health.snapshot()
    assert len(starts) == (STEPS - 2 + 19) // 20  # retried at every scheduled window
    assert health.profiler_failures_total == len(starts)
    assert statistics.median(overhead) < 0.002
    logs = [r for r in caplog.records if "injected profiler failure" in r.getMessage()]
    assert len(logs) == 1
    steps = [
        r["step"]
        for line in (tmp_path / "out.jsonl").read_text().splitlines()
        for r in json.loads(line)["reports"]
    ]
    assert steps == list(range(STEPS))


def test_two_rank_job_with_hanging_collector_and_failing_profiler(tmp_path: Path) -> None:
    hanging = helpers.HangingCollector()
    try:
        result = helpers.run_job(
            tmp_path,
            "--steps", "12",
            "--collector-url", hanging.url,
            "--fail-profiler",
            "--times", str(tmp_path / "times{rank}.json"),
            "--close-timeout-s", "2",
            "--option", "profile_first_step=2",
            "--option", "profile_every_steps=3",
            "--option", "profile_max_overhead_ratio=1",
            "--option", "request_timeout_s=10",
            "--option", "peak_flops=1e11",
            "--option", "flush_interval_s=0.05",
        )  # fmt: skip
    finally:
        hanging.close()
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    for rank in (0, 1):
        times = json.loads((tmp_path / f"times{rank}.json").read_text())
        steady = times["step_s"][1:]  # step 0 counts FLOPs under FlopCounterMode
        assert max(steady) < 10.0, steady  # never waited for the 10 s request timeout
        assert times["close_s"] < 2.0 + 1.0
        health = times["health"]
        assert health["profiler_failures_total"] >= 1
        # every report dropped: the first send still hangs at close (its failure may not be
        # counted yet), the rest were still queued at the close deadline
        assert health["reports_dropped_total"] == 12
        assert health["internal_errors"] == 0
    assert result.stderr.count("injected profiler failure") == 2  # once per rank
