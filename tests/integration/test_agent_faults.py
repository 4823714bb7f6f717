"""Faults: collector absent, hanging, answering 500, and a failing profiler.

In every case the job finishes, the failure is counted, and it is logged once per interval
rather than once per attempt. The training thread never waits on telemetry: against a collector
that holds every request and a request timeout of an hour, the steps all end while a send is
still held, and close returns at its own deadline (a wait on the request would hang the test,
which fails past a hang-only deadline); no bound on how long a step took.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from mfuscope.agent import Agent
from mfuscope.agent._agent import Seams, agent_with_seams

from tests.support import agent_helpers as helpers
from tests.support.waiting import HANG_S, wait_until

pytestmark = pytest.mark.slow  # real HTTP servers and agent threads on the wall clock

REQUEST_TIMEOUT_S = 3600.0  # a send the training thread waited for would never end
STEPS = 150


def _train_step(weight: torch.Tensor) -> None:
    (torch.randn(64, 64) @ weight).sum().backward()


def _run(agent: Agent, midway: Callable[[], None] = lambda: None) -> None:
    """Run the steps on a thread of their own, calling `midway` after the first fifth; fail if
    they do not end within a deadline that only a wait on telemetry (an hour-long request)
    could reach."""
    weight = torch.randn(64, 64, requires_grad=True)

    def train() -> None:
        for step in range(STEPS):
            if step == STEPS // 5:
                midway()
            with agent.step():
                _train_step(weight)

    _within_hang_deadline(train, "the training loop (it waited on telemetry)")


def _within_hang_deadline(work: Callable[[], None], what: str) -> None:
    failure: list[BaseException] = []

    def run() -> None:
        try:
            work()
        except BaseException as exc:  # re-raised on the test's thread
            failure.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(HANG_S)
    assert not thread.is_alive(), f"{what} did not end within {HANG_S:.0f} s"
    if failure:
        raise failure[0]


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
def collector(
    request: pytest.FixtureRequest,
) -> Iterator[tuple[str, helpers.HangingCollector | None]]:
    """The collector's URL, and the hanging collector itself when it is one."""
    kind = request.param
    if kind == "absent":
        yield helpers.closed_port_url(), None
        return
    if kind == "hanging":
        hanging = helpers.HangingCollector()
        try:
            yield hanging.url, hanging
        finally:
            hanging.close()
        return
    server = helpers.StubCollector(status=500)
    try:
        yield server.url, None
    finally:
        server.close()


@pytest.mark.parametrize("collector", ["absent", "hanging", "error500"], indirect=True)
def test_collector_faults_never_reach_the_training_loop(
    collector: tuple[str, helpers.HangingCollector | None], caplog: pytest.LogCaptureFixture
) -> None:
    url, hanging = collector
    agent = _agent(url)

    def held() -> None:  # the rest of the steps run while the collector holds a send
        if hanging is not None:
            wait_until(lambda: hanging.connections >= 1, "the first send to reach the collector")

    with caplog.at_level(logging.WARNING, logger="mfuscope.agent"):
        _run(agent, midway=held)
        if hanging is not None:  # and it is held still: nothing failed, nothing waited
            assert agent.health.snapshot().send_failures_total == 0
        _within_hang_deadline(lambda: agent.close(timeout_s=1.5), "close")
    health = agent.health.snapshot()
    assert health.reports_dropped_total >= 1
    if hanging is None:  # refused or answered 500: failed sends, counted and logged once
        assert health.send_failures_total >= 1
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
        _run(agent)
        agent.close()
    health = agent.health.snapshot()
    assert len(starts) == (STEPS - 2 + 19) // 20  # retried at every scheduled window
    assert health.profiler_failures_total == len(starts)
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
            "--option", f"request_timeout_s={REQUEST_TIMEOUT_S}",
            "--option", "peak_flops=1e11",
            "--option", "flush_interval_s=0.05",
        )  # fmt: skip
    finally:
        hanging.close()
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    # The job ended (within run_job's deadline) with its requests held for an hour: no step and
    # no close waited for one.
    for rank in (0, 1):
        times = json.loads((tmp_path / f"times{rank}.json").read_text())
        assert len(times["step_s"]) == 12
        health = times["health"]
        assert health["profiler_failures_total"] >= 1
        # every report dropped: the first send still hangs at close (its failure may not be
        # counted yet), the rest were still queued at the close deadline
        assert health["reports_dropped_total"] == 12
        assert health["internal_errors"] == 0
    assert result.stderr.count("injected profiler failure") == 2  # once per rank
