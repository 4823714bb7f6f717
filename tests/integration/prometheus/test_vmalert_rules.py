"""deploy/fleet/victoriametrics/vmalert_rules.py: the rule files for vmalert releases that refuse
`keep_firing_for` behave as Prometheus' `keep_firing_for` does.

promtool evaluates both on the same input series: the shipped rule unit tests pass on the
rewritten files, and on timelines made for the rewrite an alert with `keep_firing_for` and its
rewrite fire and resolve at the same evaluations, with the one documented difference (a return
of the condition shorter than `for` during the hold restarts Prometheus' countdown only).
vmalert itself (Debian's 1.79) refuses the shipped alerts file, accepts the rewritten ones, and
replaying the rewrite over the same timelines fires where promtool does.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support.processes import stop
from tests.support.victoriametrics import (
    VM_BINARIES,
    force_flush,
    missing_binaries,
    start_server,
)

ROOT = Path(__file__).resolve().parents[3]
SCRIPT = ROOT / "deploy" / "fleet" / "victoriametrics" / "vmalert_rules.py"
PROMETHEUS_DIR = ROOT / "deploy" / "prometheus"
RULE_FILES = sorted((PROMETHEUS_DIR / "rules").glob("*.yml"))
RULE_TESTS = sorted((PROMETHEUS_DIR / "tests").glob("*.yml"))

pytestmark = pytest.mark.slow

# One alert, `for: 2m`, `keep_firing_for: 5m`, on `x` of five jobs, evaluated every minute.
HELD_RULES = {
    "groups": [
        {
            "name": "held",
            "rules": [
                {
                    "alert": "Held",
                    "expr": "max by (job) (x) > 0",
                    "for": "2m",
                    "keep_firing_for": "5m",
                    "labels": {"severity": "warning"},
                }
            ],
        }
    ]
}
# x at 0, 1, 2, ... min; `stale` ends a run (the series is gone, as when the collector expires a
# silent rank), `_` is no sample.
SERIES = {
    "a": "1 1 1 1 1 stale",  # holds 0-4 min (fires at 2), gone at 5: fires until 9
    "b": "1 1 stale",  # 0-1 min, shorter than `for`: never fires
    "c": "1 1 1 1 stale _ _ 1 1 1 1 1 stale",  # holds 0-3, gone 4-6, back 7-11: fires 2-16
    "d": "1 1 1 stale _ _ _ _ _ _ 1 stale",  # fires 2-7; back at 10 for a minute: only pending
    # Fires at 2, back at 5 for a minute, shorter than `for`, during the hold: Prometheus
    # restarts the countdown there (fires until 10), the rewrite counts from 2 (until 7).
    "e": "1 1 1 stale _ 1 stale",
}
MINUTES = range(19)
# The minutes at which each job's alert fires, under Prometheus' keep_firing_for.
FIRING = {"a": range(2, 10), "c": range(2, 17), "d": range(2, 8), "e": range(2, 11)}
REWRITE_FIRING = {**FIRING, "e": range(2, 8)}


def _rewrite(out: Path, files: list[Path], interval: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, str(SCRIPT), "--out", str(out), "--interval", interval]
    return subprocess.run([*command, *map(str, files)], capture_output=True, text=True, timeout=60)


def _promtool_test(promtool: str, suites: dict[Path, dict[str, Any]], failing: int = 0) -> str:
    """Run the `suites` (written to their paths) with one promtool; its output. The test fails
    unless all but the last `failing` suites pass and those fail."""
    for path, suite in suites.items():
        path.write_text(yaml.safe_dump(suite), encoding="utf-8")
    result = subprocess.run(
        [promtool, "test", "rules", *map(str, suites)], capture_output=True, text=True, timeout=120
    )
    output = result.stdout + result.stderr
    assert (result.returncode == 0) == (failing == 0), output
    reports = output.split("Unit Testing: ")[1:]
    assert len(reports) == len(suites), output
    outcomes = ["SUCCESS" in report for report in reports]
    assert outcomes == [True] * (len(suites) - failing) + [False] * failing, output
    return output


def _held_suite(rule_file: Path, firing: dict[str, range]) -> dict[str, Any]:
    """A promtool suite: `SERIES` into `rule_file`, expecting `firing` at every minute."""
    return {
        "rule_files": [str(rule_file)],
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": [
                    {"series": f'x{{job="{job}"}}', "values": values}
                    for job, values in SERIES.items()
                ],
                "alert_rule_test": [
                    {
                        "eval_time": f"{minute}m",
                        "alertname": "Held",
                        "exp_alerts": [
                            {"exp_labels": {"severity": "warning", "job": job}}
                            for job, minutes in sorted(firing.items())
                            if minute in minutes
                        ],
                    }
                    for minute in MINUTES
                ],
            }
        ],
    }


def _write_held_rules(tmp_path: Path) -> tuple[Path, Path]:
    """`HELD_RULES` as written, and as the rewrite writes them (every minute)."""
    original = tmp_path / "held.yml"
    original.write_text(yaml.safe_dump(HELD_RULES), encoding="utf-8")
    result = _rewrite(tmp_path / "vmalert", [original], "1m")
    assert result.returncode == 0, result.stderr
    rewritten = tmp_path / "vmalert" / "held.yml"
    (rule,) = yaml.safe_load(rewritten.read_text())["groups"][0]["rules"]
    assert "keep_firing_for" not in rule and rule["for"] == "2m"
    return original, rewritten


def _held_alerts() -> set[str]:
    """The shipped alerts that use keep_firing_for (the ones the rewrite changes)."""
    return {
        rule["alert"]
        for path in RULE_FILES
        for group in yaml.safe_load(path.read_text(encoding="utf-8"))["groups"]
        for rule in group["rules"]
        if "keep_firing_for" in rule
    }


def test_the_shipped_rule_tests_pass_on_the_rewritten_files(tmp_path: Path, promtool: str) -> None:
    """The shipped unit tests of the rewritten alerts (the test groups that check one), run on
    the rewritten files (the other rules pass through unchanged: checked here, and their tests
    are not run twice; no rule reads ALERTS, so a rewrite changes no other rule's results)."""
    held = _held_alerts()
    if not held:
        pytest.skip("no shipped alert uses keep_firing_for: the rewrite changes nothing")
    out = tmp_path / "vmalert"
    result = _rewrite(out, RULE_FILES, "1m")  # the unit tests evaluate every minute
    assert result.returncode == 0, result.stderr
    assert sorted(p.name for p in out.iterdir()) == [p.name for p in RULE_FILES]
    for path in RULE_FILES:
        before = yaml.safe_load(path.read_text(encoding="utf-8"))["groups"]
        after = yaml.safe_load((out / path.name).read_text(encoding="utf-8"))["groups"]
        assert [g["name"] for g in before] == [g["name"] for g in after]
        for old, new in zip(before, after, strict=True):
            kept = [r for r in old["rules"] if r.get("alert") not in held]
            assert kept == [r for r in new["rules"] if r.get("alert") not in held]
    assert not any("ALERTS" in path.read_text(encoding="utf-8") for path in RULE_FILES)
    suites, checked = {}, set()
    for path in RULE_TESTS:
        suite = yaml.safe_load(path.read_text(encoding="utf-8"))
        suite["tests"] = [
            group
            for group in suite["tests"]
            if held & {case["alertname"] for case in group.get("alert_rule_test", [])}
        ]
        if suite["tests"]:
            suite["rule_files"] = [str(out / Path(f).name) for f in suite["rule_files"]]
            suites[tmp_path / path.name] = suite
            checked |= {c["alertname"] for g in suite["tests"] for c in g["alert_rule_test"]}
    assert checked >= held, f"no shipped rule test covers {sorted(held - checked)}"
    _promtool_test(promtool, suites)


def test_the_rewrite_fires_and_resolves_as_keep_firing_for(tmp_path: Path, promtool: str) -> None:
    original, rewritten = _write_held_rules(tmp_path)
    _promtool_test(
        promtool,
        {
            tmp_path / "prometheus.yml": _held_suite(original, FIRING),
            tmp_path / "rewrite.yml": _held_suite(rewritten, REWRITE_FIRING),
            # The difference is real: each expectation fails on the other file.
            tmp_path / "not-prometheus.yml": _held_suite(original, REWRITE_FIRING),
            tmp_path / "not-rewrite.yml": _held_suite(rewritten, FIRING),
        },
        failing=2,
    )


def test_vmalert_fires_the_rewrite_as_promtool_does(tmp_path: Path) -> None:
    """The same timelines in VictoriaMetrics (samples every 15 s, so that a series ends as with
    stale markers), and vmalert replaying the rewritten rule over them every minute: its ALERTS
    fire at the minutes of `REWRITE_FIRING`, and stay pending where `for` is not met."""
    reason = missing_binaries(VM_BINARIES)
    if reason:
        pytest.skip(reason)
    _, rewritten = _write_held_rules(tmp_path)
    store = start_server(
        "victoria-metrics",
        lambda address: [
            "victoria-metrics",
            f"-storageDataPath={tmp_path / 'data'}",
            f"-httpListenAddr={address}",
            "-loggerLevel=WARN",
        ],
        tmp_path,
    )
    try:
        start = (int(time.time()) // 3600 - 2) * 3600  # on an hour, two hours ago
        lines = [
            f'x{{job="{job}"}} {value} {(start + 60 * minute + offset) * 1000}'
            for job, values in SERIES.items()
            for minute, value in enumerate(values.split())
            if value not in ("stale", "_")
            for offset in (-45, -30, -15, 0)
            if minute > 0 or offset == 0
        ]
        request = urllib.request.Request(
            f"{store.url}/api/v1/import/prometheus", "\n".join(lines).encode()
        )
        with urllib.request.urlopen(request, timeout=10):
            pass
        force_flush(store.url)

        def iso(unix: int) -> str:
            return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(unix))

        replay = subprocess.run(
            [
                "vmalert",
                f"-rule={rewritten}",
                f"-datasource.url={store.url}",
                "-datasource.queryStep=1m",  # the range queries' step: the group's interval
                f"-remoteWrite.url={store.url}",
                f"-replay.timeFrom={iso(start)}",
                f"-replay.timeTo={iso(start + 60 * MINUTES[-1])}",
                "-replay.disableProgressBar",
                "-loggerLevel=ERROR",
            ],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert replay.returncode == 0, replay.stdout + replay.stderr
        force_flush(store.url)

        def states(state: str) -> dict[int, set[str]]:
            """Jobs with an ALERTS sample in that state at each minute (no lookback)."""
            out = {}
            for minute in MINUTES:
                query = f'count_over_time(ALERTS{{alertname="Held", alertstate="{state}"}}[30s])'
                params = urllib.parse.urlencode({"query": query, "time": start + 60 * minute})
                with urllib.request.urlopen(f"{store.url}/api/v1/query?{params}") as response:
                    result = json.load(response)["data"]["result"]
                out[minute] = {sample["metric"]["job"] for sample in result}
            return out

        expected = {m: {j for j, r in REWRITE_FIRING.items() if m in r} for m in MINUTES}
        assert states("firing") == expected
        pending = states("pending")
        assert pending[0] == pending[1] == set(SERIES) and pending[10] == {"d"}
    finally:
        stop(store.process)


def test_vmalert_refuses_the_shipped_alerts_and_takes_the_rewritten_ones(tmp_path: Path) -> None:
    vmalert = shutil.which("vmalert")
    if vmalert is None:
        pytest.skip("vmalert is not installed: `./dev setup` installs it (`victoria-metrics`)")
    out = tmp_path / "vmalert"
    assert _rewrite(out, RULE_FILES, "15s").returncode == 0

    def dry_run(pattern: str) -> subprocess.CompletedProcess[str]:
        command = [vmalert, "-dryRun", f"-rule={pattern}", "-loggerLevel=ERROR"]
        return subprocess.run(command, capture_output=True, text=True, timeout=60)

    checked = dry_run(f"{out}/*.yml")
    assert checked.returncode == 0, checked.stdout + checked.stderr
    if any("keep_firing_for" in p.read_text(encoding="utf-8") for p in RULE_FILES):
        shipped = dry_run(f"{PROMETHEUS_DIR / 'rules'}/*.yml")
        assert shipped.returncode != 0 and "keep_firing_for" in shipped.stdout + shipped.stderr


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (None, "No such file"),
        ("groups: [", "held.yml"),
        ("rules: []", "no `groups` list"),
        (
            "groups: [{name: g, rules: [{record: r, expr: x, keep_firing_for: 1m}]}]",
            "keep_firing_for on a recording rule",
        ),
        (
            "groups: [{name: g, rules: [{alert: A, expr: x, keep_firing_for: soon}]}]",
            "not a duration",
        ),
    ],
)
def test_bad_input_is_one_line_and_exit_2(
    tmp_path: Path, content: str | None, message: str
) -> None:
    source = tmp_path / "held.yml"
    if content is not None:
        source.write_text(content, encoding="utf-8")
    result = _rewrite(tmp_path / "out", [source], "15s")
    assert result.returncode == 2
    assert len(result.stderr.strip().splitlines()) == 1 and message in result.stderr
    assert not (tmp_path / "out").exists()  # nothing half written
