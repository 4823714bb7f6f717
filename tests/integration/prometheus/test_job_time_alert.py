"""MFUScopeJobTimeLost on a real Prometheus: two real training processes with the agent feed a real
collector, one saving a checkpoint every 10 steps in 5 % of its time, the other with saves that
take 3x as long (about 13 %). The alert must fire on the second, naming checkpoint_save, and never
on the first.

The shipped job-time rules and alert run with their time scaled down (`SCALE`: one second here
stands for two minutes there, so the hour becomes 30 s and `for: 5m` 2.5 s); only they are loaded.
The jobs are `tests/support/ledger_job.py` without torchrun (one process, no collectives).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.integration.prometheus.conftest import CollectorProcess, PrometheusServer
from tests.support.processes import spawn, stop

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[3]
RULES = ROOT / "deploy" / "prometheus" / "rules"
SCALE = 1 / 120
DURATION_S = 55.0
STEP_S = 0.1
JOBS = {"healthy": 0.05, "slow-saves": 0.15}  # checkpoint save seconds every 10 steps of 0.1 s
_SECONDS = {"s": 1, "m": 60, "h": 3600}


def _scaled(duration: str) -> str:
    return f"{round(int(duration[:-1]) * _SECONDS[duration[-1]] * SCALE * 1000)}ms"


def _scale(expr: str) -> str:
    expr = re.sub(r"\[(\d+[smh])\]", lambda m: f"[{_scaled(m[1])}]", expr)
    return re.sub(r"offset (\d+[smh])", lambda m: f"offset {_scaled(m[1])}", expr)


def _rule_files(home: Path) -> list[Path]:
    """The job-time group and MFUScopeJobTimeLost, time scaled."""
    recording: dict[str, Any] = yaml.safe_load((RULES / "mfuscope-recording.yml").read_text())
    (group,) = [g for g in recording["groups"] if g["name"] == "mfuscope.job_time"]
    for rule in group["rules"]:
        rule["expr"] = _scale(rule["expr"])
    alerts: dict[str, Any] = yaml.safe_load((RULES / "mfuscope-alerts.yml").read_text())
    (alert,) = [
        r for g in alerts["groups"] for r in g["rules"] if r.get("alert") == "MFUScopeJobTimeLost"
    ]
    alert["expr"] = _scale(alert["expr"])
    alert["for"] = _scaled(alert["for"])
    paths = [home / "recording.yml", home / "alerts.yml"]
    paths[0].write_text(yaml.safe_dump({"groups": [group]}))
    paths[1].write_text(yaml.safe_dump({"groups": [{"name": "alerts", "rules": [alert]}]}))
    return paths


@pytest.fixture
def jobs(collector: CollectorProcess, tmp_path: Path) -> Iterator[list[subprocess.Popen[bytes]]]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MFUSCOPE_")}
    env.update(OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    started = []
    for job, save_s in JOBS.items():
        command = [sys.executable, str(ROOT / "tests" / "support" / "ledger_job.py")]
        command += ["--job", job, "--collector-url", collector.url, "--out", str(tmp_path / job)]
        command += ["--duration-s", str(DURATION_S), "--step-s", str(STEP_S), "--startup-s", "0"]
        command += ["--save-every", "10", "--save-s", str(save_s), "--eval-every", "100000"]
        started.append(spawn(command, tmp_path / f"{job}.log", env=env))
    yield started
    for process in started:
        stop(process)


def test_the_alert_names_slow_checkpoint_saves_and_spares_a_healthy_job(
    start_prometheus: Callable[..., PrometheusServer],
    collector: CollectorProcess,
    jobs: list[subprocess.Popen[bytes]],
    tmp_path: Path,
) -> None:
    prometheus = start_prometheus([collector.address], rule_files=_rule_files(tmp_path))
    prometheus.wait_scraping_collector()
    firing = 'ALERTS{alertname="MFUScopeJobTimeLost", alertstate="firing"}'
    deadline = time.monotonic() + DURATION_S + 60
    fired: list[dict[str, Any]] = []
    while time.monotonic() < deadline and not fired:
        fired = prometheus.samples(firing)
        assert all(j.poll() in (None, 0) for j in jobs), "a job failed"
        time.sleep(0.5)
    assert fired, prometheus.samples("job_budget:mfuscope_job_time:ratio_increase1h")
    (alert,) = fired
    assert alert["metric"]["job"] == "slow-saves"
    assert alert["metric"]["category"] == "checkpoint_save"
    assert alert["metric"]["budget"] == "checkpoint"
    for job in jobs:
        assert job.wait(DURATION_S + 60) == 0
    # The healthy job was never even pending, through both jobs' whole lives.
    ever = prometheus.samples('max_over_time(ALERTS{alertname="MFUScopeJobTimeLost"}[5m])')
    assert {s["metric"]["job"] for s in ever} == {"slow-saves"}
    shares = prometheus.samples(
        'max_over_time(job_category:mfuscope_job_time:ratio_increase1h{category="checkpoint_save"}[5m])'
    )
    share = {s["metric"]["job"]: float(s["value"][1]) for s in shares}
    assert share["healthy"] < 0.10 < share["slow-saves"]
