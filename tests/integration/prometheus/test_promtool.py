"""promtool over the project's Prometheus files: rules, rule unit tests, configs, and every
dashboard query parsed as PromQL (Grafana variables substituted)."""

from __future__ import annotations

import re
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from tests.support.rule_subset import subset_suite

ROOT = Path(__file__).resolve().parents[3]
PROMETHEUS_DIR = ROOT / "deploy" / "prometheus"
RULE_FILES = sorted((PROMETHEUS_DIR / "rules").glob("*.yml"))
RULE_TESTS = sorted((PROMETHEUS_DIR / "tests").glob("*.yml"))

pytestmark = pytest.mark.slow


def _run(args: list[str], cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    # A bound on a hung promtool only: the longest rule test file takes ~45 s of CPU alone.
    return subprocess.run(args, capture_output=True, text=True, cwd=cwd, timeout=600)


def _rule_count() -> int:
    return sum(
        len(group["rules"])
        for path in RULE_FILES
        for group in yaml.safe_load(path.read_text(encoding="utf-8"))["groups"]
    )


def test_rules_pass_promtool_check(promtool: str) -> None:
    result = _run([promtool, "check", "rules", *map(str, RULE_FILES)])
    assert result.returncode == 0, result.stdout + result.stderr
    found = sum(int(n) for n in re.findall(r"SUCCESS: (\d+) rules found", result.stdout))
    assert found == _rule_count()


def test_every_rule_test_file_is_run() -> None:
    assert [p.name for p in RULE_TESTS] == [
        "alerts_test.yml",
        "arrivals_test.yml",
        "definitions_test.yml",
        "fleet_stragglers_test.yml",
        "hangs_test.yml",
        "job_time_test.yml",
        "recording_test.yml",
        "regression_test.yml",
        "run_baseline_test.yml",
        "window_cadence_test.yml",
    ]


# One file per test, the workers share them out. Each runs with the rules its checks read
# (`rule_subset`: the same results, a third of the time for the slowest files).
@pytest.mark.parametrize("path", RULE_TESTS, ids=[p.stem for p in RULE_TESTS])
def test_rule_unit_tests_pass(promtool: str, path: Path, tmp_path: Path) -> None:
    result = _run([promtool, "test", "rules", str(subset_suite(path, tmp_path))])
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.count("SUCCESS") == 1


def test_promtool_catches_a_wrong_expectation(promtool: str, tmp_path: Path) -> None:
    """The rule tests can fail, as the suite runs them (`subset_suite`): one case of
    alerts_test.yml with an expected label flipped."""
    suite = yaml.safe_load((PROMETHEUS_DIR / "tests" / "alerts_test.yml").read_text())
    (case,) = [t for t in suite["tests"] if t["name"] == "ranks with an unknown peak"]
    assert case["alert_rule_test"][-1]["exp_alerts"][0]["exp_labels"]["job"] == "a"
    case["alert_rule_test"][-1]["exp_alerts"][0]["exp_labels"]["job"] = "z"
    suite["tests"] = [case]
    suite["rule_files"] = [
        str((PROMETHEUS_DIR / "tests" / f).resolve()) for f in suite["rule_files"]
    ]
    path = tmp_path / "broken_test.yml"
    path.write_text(yaml.safe_dump(suite), encoding="utf-8")
    result = _run([promtool, "test", "rules", str(subset_suite(path, tmp_path / "subset"))])
    output = result.stdout + result.stderr
    assert result.returncode != 0 and "FAILED" in output and "MFUScopePeakFlopsUnknown" in output


def test_plain_prometheus_config_passes_promtool(promtool: str) -> None:
    result = _run([promtool, "check", "config", str(PROMETHEUS_DIR / "prometheus.yml")])
    assert result.returncode == 0, result.stdout + result.stderr


def test_compose_prometheus_config_passes_promtool(promtool: str, tmp_path: Path) -> None:
    """The compose config, with its container rule paths mapped back onto the repository (what
    docker-compose.yml mounts at /etc/prometheus/rules)."""
    config = yaml.safe_load((ROOT / "deploy" / "compose" / "prometheus.yml").read_text())
    config["rule_files"] = [
        f.replace("/etc/prometheus/rules", str(PROMETHEUS_DIR / "rules"))
        for f in config["rule_files"]
    ]
    path = tmp_path / "prometheus.yml"
    path.write_text(yaml.safe_dump(config), encoding="utf-8")
    result = _run([promtool, "check", "config", str(path)])
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(RULE_FILES)} rule files found" in result.stdout


def test_kubernetes_scrape_config_passes_promtool(promtool: str, tmp_path: Path) -> None:
    config = yaml.safe_load(
        (ROOT / "deploy" / "kubernetes" / "prometheus-scrape-config.yml").read_text()
    )
    path = tmp_path / "prometheus.yml"
    path.write_text(yaml.safe_dump(config), encoding="utf-8")
    result = _run([promtool, "check", "config", str(path)])
    if "field kubernetes_sd_configs not found" in result.stdout + result.stderr:
        pytest.skip(
            "this promtool lacks Kubernetes service discovery (Debian builds it without); "
            "the file's structure is checked by tests/unit/deploy/*.py"
        )
    assert result.returncode == 0, result.stdout + result.stderr


def test_every_dashboard_query_is_valid_promql(
    promtool: str,
    tmp_path: Path,
    dashboard_and_rule_promql: Callable[[str], list],
) -> None:
    """Each dashboard expression becomes a recording rule in its own group, so promtool names
    the one that does not parse."""
    sources = [s for s in dashboard_and_rule_promql("some-job") if s.kind in ("panel", "variable")]
    # Every dashboard gives both panel queries and variable queries (the extraction found them).
    found = {(s.origin.split(" / ")[0], s.kind) for s in sources}
    stems = {p.stem for p in (ROOT / "dashboards").glob("*.json")}
    assert found == {(stem, kind) for stem in stems for kind in ("panel", "variable")}
    groups = [
        {"name": f"{i}: {s.origin}", "rules": [{"record": f"dashboard_query_{i}", "expr": s.expr}]}
        for i, s in enumerate(sources)
    ]
    path = tmp_path / "dashboard-queries.yml"
    path.write_text(yaml.safe_dump({"groups": groups}), encoding="utf-8")
    result = _run([promtool, "check", "rules", str(path)])
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(sources)} rules found" in result.stdout


FLEET_DIR = ROOT / "deploy" / "fleet"
FLEET_CONFIGS = {
    "edge-prometheus.yml": [],
    "edge-agent.yml": ["--agent"],
    "central-prometheus.yml": [],
}


def test_every_fleet_prometheus_config_is_checked() -> None:
    configs = {
        p.name
        for p in FLEET_DIR.glob("*.yml")
        if "scrape_configs" in (yaml.safe_load(p.read_text(encoding="utf-8")) or {})
    }
    assert configs == set(FLEET_CONFIGS)


@pytest.mark.parametrize("name", sorted(FLEET_CONFIGS))
def test_fleet_prometheus_configs_pass_promtool(promtool: str, name: str) -> None:
    """The Prometheus configurations of deploy/fleet/ as shipped (no container paths): the edge
    loads the project's rules by their paths in the repository."""
    result = _run([promtool, "check", "config", *FLEET_CONFIGS[name], str(FLEET_DIR / name)])
    assert result.returncode == 0, result.stdout + result.stderr
    if name == "edge-prometheus.yml":
        assert f"SUCCESS: {len(RULE_FILES)} rule files found" in result.stdout
