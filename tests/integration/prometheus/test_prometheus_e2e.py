"""End to end through a real Prometheus: a 2-rank gloo training job with the mfuscope agent feeds a
real collector, Prometheus scrapes it every second and evaluates the project's rules, and then
every PromQL expression of the dashboards and rules runs through Prometheus's HTTP API.

None may error, every rule must evaluate healthily, and the core panels (MFU, HFU, the step
decomposition, bus bandwidth) must return data.
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support.launch import job_command
from tests.support.processes import stop

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[3]
JOB = "e2e-prometheus"
# Enough steps that profiled windows are analysed while the job still trains: a breakdown that
# first arrives in the agents' final flush makes component counters born at their final value,
# which rate() reads as no increase (seen under CI load with 12 steps). With 30, the first window
# (steps 2-4) is analysed by about step 7 with a load average of 5 on 2 cores.
STEPS = 30
RANKS = 2

# (dashboard, panel title) -> the queries (refIds) that must return data from a CPU gloo job.
# Left out on purpose: the 6 h baseline and regression (need 30 min of history), `other`
# (CPU jobs run no memcpy/memset kernels), alerts, and failure counters that stay empty.
CORE_PANELS: dict[tuple[str, str], set[str]] = {
    ("mfuscope-fleet", "Fleet MFU (5 min)"): {"A"},
    ("mfuscope-fleet", "MFU per job"): {"A"},
    ("mfuscope-fleet", "HFU per job"): {"A"},
    ("mfuscope-fleet", "MFU per job now"): {"A"},
    ("mfuscope-job", "MFU (5 min)"): {"A"},
    ("mfuscope-job", "HFU (5 min)"): {"A"},
    ("mfuscope-job", "MFU and HFU"): {"A", "B"},
    ("mfuscope-job", "Step decomposition"): {"A", "B"},
    # MFU, and the slices of 1 - MFU (one series each, from the recorded waterfall).
    ("mfuscope-job", "MFU waterfall: where 1 - MFU goes (5 min)"): {"A", "B"},
    ("mfuscope-job", "Step time p50 / p99 / mean"): {"A", "B", "C"},
    # A CPU gloo job has no link spec (unknown: no invented rate), so the spec line (B) and every
    # efficiency query stay empty; the checks after the panels pin that down.
    ("mfuscope-communication", "Bus bandwidth by tier and op"): {"A"},
    ("mfuscope-communication", "Link spec sources"): {"A"},
    ("mfuscope-communication", "Collectives by op, axis and tier"): {"A", "C", "D"},
    # How old the newest profiled window is (the job profiled several).
    ("mfuscope-job", "Breakdown age"): {"A"},
    ("mfuscope-communication", "Breakdown age"): {"A"},
}
CORE_RECORDS = {
    "job:mfuscope_mfu:ratio_rate5m",
    "job:mfuscope_hfu:ratio_rate5m",
    "job_component:mfuscope_step_fraction:ratio_rate5m",
    "job_component:mfuscope_waterfall_slice:ratio_rate5m",
    "job_op_axis_tier:mfuscope_collective_busbw_bytes_per_second:ratio_rate5m",
    "job_tier_op:mfuscope_collective_busbw_bytes_per_second:ratio_rate5m",
    "job_op_axis_tier:mfuscope_collective_busbw_bytes_per_second:last1h_ratio_rate5m",
}


def _start_training_job(collector_url: str, tmp_path: Path) -> subprocess.Popen[bytes]:
    """The packaged demo job (DDP over a `dp` DeviceMesh axis, activation checkpointing),
    profiled from step 2 and then as often as a 50 % overhead cap allows, so that profiled
    windows (decomposition, collectives) reach the collector within a short run. Its output goes
    to `tmp_path/job.log`.

    The agents flush every 0.5 s (default 5 s) so that the counters grow over several 1 s
    scrapes: rate() ignores the jump from "no series" to a series' first value, so counters
    that arrived in a single batch would show no rate at all."""
    command, env = job_command(
        "mfuscope.cli.demo.job.train_demo",
        f"--steps={STEPS}",
        f"--job={JOB}",
        f"--collector-url={collector_url}",
        "--profile-first-step=2",
        "--profile-every-s=0.5",
        "--profile-max-overhead=0.5",
        temp=tmp_path / "tmp",
        ranks=RANKS,
        module=True,
    )
    env["MFUSCOPE_FLUSH_INTERVAL_S"] = "0.5"
    with (tmp_path / "job.log").open("wb") as log:
        return subprocess.Popen(
            command, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=tmp_path
        )


def _value(samples: list[dict[str, Any]]) -> float:
    assert len(samples) == 1, samples
    return float(samples[0]["value"][1])


def test_dashboards_and_rules_run_on_a_live_training_job(
    collector: Any,
    start_prometheus: Callable[[list[str]], Any],
    dashboard_and_rule_promql: Callable[[str], list[Any]],
    wait_until: Callable[..., None],
    tmp_path: Path,
) -> None:
    prometheus = start_prometheus([collector.address])
    # Both start at once: Prometheus' first scrape waits ~5 s for its service discovery, and the
    # job takes about as long or longer to send its first report. Every counter checked here
    # grows until the job's end, so its rate does not depend on which came first.
    job = _start_training_job(collector.url, tmp_path)
    try:
        prometheus.wait_scraping_collector()
        returncode = job.wait(timeout=300)
    finally:
        stop(job)
    assert returncode == 0, (tmp_path / "job.log").read_text(errors="replace")[-6000:]

    # Every report is in the collector once the job has exited (the agents flush on close);
    # wait until Prometheus has scraped the final counts and evaluated the rules on them.
    steps = f'mfuscope_steps_total{{job="{JOB}"}}'
    wait_until(
        lambda: [float(s["value"][1]) for s in prometheus.samples(steps)] == [STEPS * RANKS],
        30,
        f"{steps} == {STEPS * RANKS} in Prometheus",
    )

    def missing_records() -> list[str]:
        return [n for n in sorted(CORE_RECORDS) if not prometheus.samples(f'{n}{{job="{JOB}"}}')]

    wait_until(
        lambda: not missing_records(),
        30,
        lambda: f"samples of the core recording rules; still missing: {missing_records()}",
    )

    # Every rule loaded, and every evaluation healthy (no many-to-many matches, no bad types).
    rules = prometheus.rules()
    expected = sum(
        len(group["rules"])
        for path in sorted((ROOT / "deploy" / "prometheus" / "rules").glob("*.yml"))
        for group in yaml.safe_load(path.read_text(encoding="utf-8"))["groups"]
    )
    assert len(rules) == expected
    unhealthy = [(r["name"], r.get("lastError")) for r in rules if r["health"] != "ok"]
    assert not unhealthy, unhealthy

    # Every expression of the dashboards and rules runs; the core ones return data.
    sources = dashboard_and_rule_promql(JOB)

    def check() -> tuple[list[Any], list[Any], dict[tuple[str, str], set[str]]]:
        errors, empty = [], []
        covered: dict[tuple[str, str], set[str]] = {key: set() for key in CORE_PANELS}
        for source in sources:
            response = prometheus.query(source.expr)
            if response["status"] != "success":
                errors.append((source.origin, source.expr, response.get("error")))
                continue
            result = response["data"]["result"]
            if source.kind == "variable":
                values = {sample["metric"].get(source.label) for sample in result}
                expected_values = {"job": JOB, "axis": "dp", "tier": "intra_node"}[source.label]
                if expected_values not in values:
                    empty.append((source.origin, source.expr, sorted(map(str, values))))
            elif source.kind == "record" and source.origin.split(" ", 1)[1] in CORE_RECORDS:
                if not result:
                    empty.append((source.origin, source.expr, "no data"))
            elif source.kind == "panel":
                dashboard, rest = source.origin.split(" / ", 1)
                title, ref = rest.rsplit(" / ", 1)
                if ref in CORE_PANELS.get((dashboard, title), set()):
                    if not result:
                        empty.append((source.origin, source.expr, "no data"))
                        continue
                    covered[(dashboard, title)].add(ref)
                    # Grafana asks time series panels for a range: that must work and have data too.
                    ranged = prometheus.query_range(source.expr, seconds=120)
                    if ranged["status"] != "success" or not ranged["data"]["result"]:
                        empty.append((source.origin, source.expr, f"range: {ranged}"))
        return errors, empty, covered

    # A rule that reads another group's recorded series (the `last1h` ones) has data from that
    # group's evaluation after the first one that had data: give it a few evaluations.
    wait_until(
        lambda: not any(check()[:2]), 30, lambda: f"every core query with data: {check()[:2]}"
    )
    errors, empty, covered = check()
    assert {s.kind for s in sources} == {"variable", "panel", "record", "alert"}
    assert not errors, errors
    assert not empty, empty
    assert covered == CORE_PANELS, "a core panel was renamed or lost a query"

    # The numbers hang together on real data.
    mfu = _value(prometheus.samples(f'job:mfuscope_mfu:ratio_rate5m{{job="{JOB}"}}'))
    hfu = _value(prometheus.samples(f'job:mfuscope_hfu:ratio_rate5m{{job="{JOB}"}}'))
    # The demo job checkpoints activations: HFU > MFU. No upper bound: the CPU peak is a short
    # calibration that a loaded machine can underestimate.
    assert 0 < mfu < hfu, (mfu, hfu)
    fractions = prometheus.samples(
        f'sum(job_component:mfuscope_step_fraction:ratio_rate5m{{job="{JOB}"}})'
    )
    assert abs(_value(fractions) - 1) < 1e-9
    components = {
        s["metric"]["component"]
        for s in prometheus.samples(
            f'job_component:mfuscope_step_fraction:ratio_rate5m{{job="{JOB}"}}'
        )
    }
    assert {"compute", "recompute", "exposed_comm"} <= components, components
    busbw = prometheus.samples(
        "job_op_axis_tier:mfuscope_collective_busbw_bytes_per_second:ratio_rate5m"
        f'{{job="{JOB}", op="all_reduce", axis="dp", tier="intra_node"}}'
    )
    assert _value(busbw) > 0
    # CPU/gloo: the spec is an explicit unknown, so there is no efficiency to show or alert on.
    assert {
        s["metric"]["source"]
        for s in prometheus.samples(f'mfuscope_tier_peak_info{{job="{JOB}", axis="dp"}}')
    } == {"unknown"}
    assert not prometheus.samples(f'mfuscope_tier_peak_bandwidth_bytes_per_second{{job="{JOB}"}}')
    assert not prometheus.samples(
        f'job_op_axis_tier:mfuscope_collective_busbw_efficiency:ratio_rate5m{{job="{JOB}"}}'
    )
