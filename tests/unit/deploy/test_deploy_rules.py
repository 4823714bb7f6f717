"""Prometheus rules and scrape configs: structure, naming, runbooks, and promtool test coverage.

promtool itself runs in tests/integration/prometheus/test_promtool.py; these checks need no binary.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from mfuscope.core.promql import recording

ROOT = Path(__file__).resolve().parents[3]
PROMETHEUS = ROOT / "deploy" / "prometheus"
RULE_FILES = sorted((PROMETHEUS / "rules").glob("*.yml"))
RECORDING_TESTS = PROMETHEUS / "tests" / "recording_test.yml"
ALERT_TESTS = PROMETHEUS / "tests" / "alerts_test.yml"
# The regression alert and its recording rules, fed raw counters over whole job lifetimes.
REGRESSION_TESTS = PROMETHEUS / "tests" / "regression_test.yml"
# The job-wide straggler rules and alert on 256 simulated nodes (generated: tests/support).
FLEET_TESTS = PROMETHEUS / "tests" / "fleet_stragglers_test.yml"
# The rules and alerts fed by profiled windows, with window-shaped counters at a window every 5,
# 10 and 30 min and with collectives timed on every step (generated: tests/support).
WINDOW_TESTS = PROMETHEUS / "tests" / "window_cadence_test.yml"
# The run-baseline alert: runs of one run key against each other (a good run, a worse one, a
# key's first run, another key).
RUN_BASELINE_TESTS = PROMETHEUS / "tests" / "run_baseline_test.yml"
# The hang alert, and a normal end and a long pause paging nobody.
HANG_TESTS = PROMETHEUS / "tests" / "hangs_test.yml"
ARRIVAL_TESTS = PROMETHEUS / "tests" / "arrivals_test.yml"
# The job-time ledger's rules and MFUScopeJobTimeLost, fed the collector's raw counters.
JOB_TIME_TESTS = PROMETHEUS / "tests" / "job_time_test.yml"
# The recording rules against core's Python definitions on the same totals (generated:
# tests/support).
DEFINITIONS_TESTS = PROMETHEUS / "tests" / "definitions_test.yml"
# Alerts whose annotations also name the cause (the MFU waterfall slice that grew most; the rank
# a hung job waits for).
WITH_CAUSE = {
    "MFUScopeMFURegression",
    "MFUScopeCollectiveHang",
    "MFUScopeBelowRunBaseline",
    "MFUScopeJobTimeLost",
}
OPERATIONS = ROOT / "docs" / "operations.md"
SCRAPE_CONFIGS = [
    PROMETHEUS / "prometheus.yml",
    ROOT / "deploy" / "compose" / "prometheus.yml",
    ROOT / "deploy" / "kubernetes" / "prometheus-scrape-config.yml",
    ROOT / "deploy" / "fleet" / "edge-prometheus.yml",
    ROOT / "deploy" / "fleet" / "edge-agent.yml",
]
SEVERITIES = {"critical", "warning", "info"}
# Prometheus's level:metric:operations convention, with our prefix on the metric part.
RECORD_NAME = re.compile(r"^[a-z_]+:mfuscope_[a-z0-9_]+:[a-z0-9_]+$")

Rule = dict[str, Any]


def _yaml(path: Path) -> Any:
    return yaml.safe_load(path.read_text(encoding="utf-8"))


def _rules() -> list[Rule]:
    return [
        rule for path in RULE_FILES for group in _yaml(path)["groups"] for rule in group["rules"]
    ]


def _recording_rules() -> list[Rule]:
    return [r for r in _rules() if "record" in r]


def _alert_rules() -> list[Rule]:
    return [r for r in _rules() if "alert" in r]


def _github_anchors(markdown: str) -> set[str]:
    """Heading anchors as GitHub renders them: lower case, punctuation dropped, spaces -> '-'."""
    anchors = set()
    for heading in re.findall(r"^#{1,6} (.+)$", markdown, flags=re.MULTILINE):
        anchors.add(re.sub(r"[^a-z0-9 _-]", "", heading.strip().lower()).replace(" ", "-"))
    return anchors


def _alert_table() -> dict[str, tuple[str, str]]:
    """The operations guide's alert table: alert -> (fires when, severity)."""
    rows = re.findall(
        r"^\| `(MFUScope\w+)` \| ([^|]+) \| ([^|]+) \|$",
        OPERATIONS.read_text(encoding="utf-8"),
        flags=re.MULTILINE,
    )
    return {alert: (when.strip(), severity.strip()) for alert, when, severity in rows}


def _threshold_text(value: float) -> str:
    """How the guide writes a threshold: ratios below 1 as whole percents, others as numbers."""
    return f"{round(value * 100)} %" if value < 1 else f"{value:g}"


def test_rule_files_are_the_two_we_document() -> None:
    assert [p.name for p in RULE_FILES] == ["mfuscope-alerts.yml", "mfuscope-recording.yml"]


def test_the_alert_table_of_the_operations_guide_states_every_rule() -> None:
    """Every alert is a row of the guide's table with its severities and its threshold, and every
    row is an alert, so on-call reads the thresholds the rules use."""
    table = _alert_table()
    assert set(table) == {r["alert"] for r in _alert_rules()}
    for rule in _alert_rules():
        when, severity = table[rule["alert"]]
        assert rule["labels"]["severity"] in severity, (rule["alert"], severity)
        # The first comparison of the expression is the alert's own threshold; zero ("any") is
        # stated in words.
        first = re.search(r"(?:[<>]=?|==)\s*([0-9.]+)", rule["expr"])
        if first is not None and float(first.group(1)) > 0:
            assert _threshold_text(float(first.group(1))) in when, (rule["alert"], when)


@pytest.mark.parametrize("rule", _recording_rules(), ids=lambda r: r["record"])
def test_recording_rule_naming(rule: Rule) -> None:
    name = rule["record"]
    assert RECORD_NAME.match(name), f"{name} does not follow level:metric:operations"
    level = name.split(":")[0]
    # Every label the level names is kept by the expression: grouped by, or carried by the
    # recorded series it reads (whose level names it), or set by the rule.
    words = set(re.split(r"[^a-z]+", rule["expr"])) | set(rule.get("labels", {}))
    for label in level.split("_"):
        assert label in (
            "job",
            "component",
            "axis",
            "tier",
            "op",
            "quantile",
            "instance",
            "rank",
            "category",
            "budget",
        ), (
            name,
            label,
        )
        assert label in words, f"{name}: level names {label!r} but the expression never keeps it"


def test_recording_rule_names_are_unique_up_to_their_labels() -> None:
    keys = [(r["record"], tuple(sorted(r.get("labels", {}).items()))) for r in _recording_rules()]
    assert len(keys) == len(set(keys))


@pytest.mark.parametrize(
    "rule", _alert_rules(), ids=lambda r: f"{r['alert']}-{r['labels']['severity']}"
)
def test_alert_has_severity_and_annotations_on_call_can_use(rule: Rule) -> None:
    assert rule["alert"].startswith("MFUScope"), (
        "the Fleet dashboard lists ALERTS{alertname=~'MFUScope.*'}"
    )
    assert rule["labels"]["severity"] in SEVERITIES
    annotations = rule["annotations"]
    cause = {"cause"} if rule["alert"] in WITH_CAUSE else set()
    assert set(annotations) == {"summary", "description", "runbook"} | cause
    assert len(annotations["summary"]) <= 160 and "\n" not in annotations["summary"]
    # The pager line names every label the alert fires per, so two firings can be told apart.
    per = {x.strip() for m in re.findall(r"\bby \(([^)]*)\)", rule["expr"]) for x in m.split(",")}
    per |= {x for m in re.findall(r"\b([a-z_]+):mfuscope_", rule["expr"]) for x in m.split("_")}
    missing = [label for label in sorted(per) if f"$labels.{label}" not in annotations["summary"]]
    assert not missing, f"{rule['alert']}: summary does not name {missing}"
    # A threshold alert says the value it crossed (the alert value or a queried figure).
    first = re.search(r"(?:[<>]=?|==)\s*([0-9.]+)", rule["expr"])
    if first is not None and float(first.group(1)) > 0:
        text = annotations["summary"] + annotations["description"]
        assert "$value" in text or "| query" in text, f"{rule['alert']}: quotes no value"
    # `for:` only on alerts whose condition can flicker; health counters fire at once.
    duration = rule.get("for", "0m")
    assert re.fullmatch(r"\d+[smh]", duration), duration


def test_annotations_name_only_alerts_and_dashboards_that_exist() -> None:
    """A runbook that sends on-call to a renamed alert or dashboard is wrong; every runbook names
    at least one place to look first."""
    alerts = {r["alert"] for r in _alert_rules()}
    dashboards = {
        json.loads(p.read_text(encoding="utf-8"))["title"].split(" / ")[-1]
        for p in (ROOT / "dashboards").glob("*.json")
    }
    places = re.compile(
        r"dashboard|/healthz|/v1/summary|\blogs?\b|MFUScope\w+|Targets page|MFUSCOPE_|"
        r"parallelism|host|node|token",
        flags=re.IGNORECASE,
    )
    for rule in _alert_rules():
        text = " ".join(rule["annotations"].values())
        for named in re.findall(r"\bMFUScope\w+", text):
            assert named in alerts, f"{rule['alert']} names unknown alert {named}"
        for named in re.findall(r"\b([A-Z]\w+) dashboard", text):
            assert named in dashboards, f"{rule['alert']} names unknown dashboard {named}"
        runbook = rule["annotations"]["runbook"].split("docs/operations.md#")[0]
        assert places.search(runbook), f"{rule['alert']}: the runbook names no place to look"


def test_runbook_links_point_at_sections_of_the_operations_guide() -> None:
    anchors = _github_anchors(OPERATIONS.read_text(encoding="utf-8"))
    for rule in _alert_rules():
        links = re.findall(r"docs/operations\.md#([a-z0-9_-]+)", rule["annotations"]["runbook"])
        assert links == [rule["alert"].lower()], (rule["alert"], links)
        assert links[0] in anchors, f"docs/operations.md has no section for {rule['alert']}"


def test_every_recording_rule_is_checked_by_a_promtool_test() -> None:
    files = (
        RECORDING_TESTS,
        REGRESSION_TESTS,
        FLEET_TESTS,
        WINDOW_TESTS,
        DEFINITIONS_TESTS,
        HANG_TESTS,
        ARRIVAL_TESTS,
        RUN_BASELINE_TESTS,
        JOB_TIME_TESTS,
    )
    tests = [t for f in files for t in _yaml(f)["tests"]]
    checked_exprs = [t["expr"] for test in tests for t in test.get("promql_expr_test", [])]
    untested = [
        r["record"]
        for r in _recording_rules()
        if not any(re.search(rf"{re.escape(r['record'])}(?![a-z0-9_:])", e) for e in checked_exprs)
    ]
    assert not untested, untested
    # Every check states its expected samples (an empty list is a deliberate absence check).
    assert all("exp_samples" in t for test in tests for t in test.get("promql_expr_test", []))


def test_every_alert_is_tested_firing_and_not_firing() -> None:
    firing: set[tuple[str, str]] = set()
    silent: set[str] = set()
    for test in [
        t
        for f in (
            ALERT_TESTS,
            REGRESSION_TESTS,
            FLEET_TESTS,
            WINDOW_TESTS,
            HANG_TESTS,
            RUN_BASELINE_TESTS,
            JOB_TIME_TESTS,
        )
        for t in _yaml(f)["tests"]
    ]:
        for case in test.get("alert_rule_test", []):
            if case["exp_alerts"]:
                cause = {"cause"} if case["alertname"] in WITH_CAUSE else set()
                for alert in case["exp_alerts"]:
                    firing.add((case["alertname"], alert["exp_labels"]["severity"]))
                    expected = {"summary", "description", "runbook"} | cause
                    assert set(alert["exp_annotations"]) == expected
            else:
                silent.add(case["alertname"])
    for rule in _alert_rules():
        assert (rule["alert"], rule["labels"]["severity"]) in firing, f"{rule['alert']} never fires"
        assert rule["alert"] in silent, f"{rule['alert']} has no not-firing case"


def test_promtool_test_files_load_the_project_rules() -> None:
    for path in (
        RECORDING_TESTS,
        ALERT_TESTS,
        REGRESSION_TESTS,
        FLEET_TESTS,
        WINDOW_TESTS,
        HANG_TESTS,
        DEFINITIONS_TESTS,
        RUN_BASELINE_TESTS,
        JOB_TIME_TESTS,
    ):
        for rule_file in _yaml(path)["rule_files"]:
            assert (path.parent / rule_file).resolve() in [p.resolve() for p in RULE_FILES]


@pytest.mark.parametrize("path", SCRAPE_CONFIGS, ids=lambda p: str(p.relative_to(ROOT)))
def test_scrape_configs_keep_the_training_job_label(path: Path) -> None:
    jobs = _yaml(path)["scrape_configs"]
    assert jobs
    for job in jobs:
        assert job["honor_labels"] is True, f"{job['job_name']}: the collector's job label is lost"
        assert "mfuscope" in job["job_name"], (
            "MFUScopeCollectorDown selects up{job=~'.*mfuscope.*'}"
        )
        assert job.get("metrics_path", "/metrics") == "/metrics"


def test_plain_prometheus_config_loads_exactly_the_project_rules() -> None:
    config = _yaml(PROMETHEUS / "prometheus.yml")
    loaded = sorted((PROMETHEUS / f).resolve() for f in config["rule_files"])
    assert loaded == [p.resolve() for p in RULE_FILES]
    assert config["scrape_configs"][0]["static_configs"][0]["targets"] == ["127.0.0.1:9464"]


def test_alert_thresholds_fire_before_the_collector_forgets_silent_ranks() -> None:
    """The collector drops ranks silent for expire_after_s (default 300 s), and their age series
    with them: the silence alerts must be able to fire before that."""
    from mfuscope.collector.app import CollectorConfig

    expire_s = CollectorConfig().expire_after_s
    seconds = {"s": 1, "m": 60, "h": 3600}
    for rule in _alert_rules():
        if "mfuscope_last_report_age_seconds" not in rule["expr"]:
            continue
        threshold = float(re.search(r"mfuscope_last_report_age_seconds\) > (\d+)", rule["expr"])[1])
        wait = int(rule["for"][:-1]) * seconds[rule["for"][-1]]
        # + one 15 s scrape interval and one 15 s rule evaluation
        assert threshold + wait + 30 < expire_s, rule["alert"]


def test_the_fleet_straggler_test_file_is_what_its_generator_writes() -> None:
    from tests.support.fleet_stragglers import render

    assert FLEET_TESTS.read_text(encoding="utf-8") == render(), (
        "regenerate: python -m tests.support.fleet_stragglers"
    )


def test_the_window_cadence_test_file_is_what_its_generator_writes() -> None:
    from tests.support.window_cadence import render

    assert WINDOW_TESTS.read_text(encoding="utf-8") == render(), (
        "regenerate: python -m tests.support.window_cadence"
    )


def test_the_definitions_test_file_is_what_its_generator_writes() -> None:
    from tests.support.definitions_case import render

    assert DEFINITIONS_TESTS.read_text(encoding="utf-8") == render(), (
        "regenerate: python -m tests.support.definitions_case"
    )


def test_no_rule_reads_a_fresh_result_of_its_own_group() -> None:
    # vmalert writes a rule's results asynchronously: a later rule of the group that reads them
    # gets the previous evaluation's, next to fresh raw series, and a ratio of the two left 0..1
    # (job:mfuscope_useful_steps:ratio_rate5m read 1.105). Only history (a range) may be read.
    groups = _yaml(PROMETHEUS / "rules" / "mfuscope-recording.yml")["groups"]
    # The groups over 15 min to 30 days may read their own results: one evaluation's lag moves
    # them by at most interval / window (core/promql/recording.py says why).
    long_windows = {"mfuscope.regression", "mfuscope.run_baseline", "mfuscope.job_time"}
    assert {g["name"] for g in groups} - long_windows == set(recording.WRITTEN_OUT)
    for group in (g for g in groups if g["name"] not in long_windows):
        recorded: list[str] = []
        for rule in group["rules"]:
            for name in recorded:
                instant = (
                    rf"(?<![a-zA-Z0-9_:]){re.escape(name)}(?![a-zA-Z0-9_:])(\{{[^}}]*\}})?(?!\s*\[)"
                )
                assert not re.search(instant, rule["expr"]), (group["name"], rule["record"], name)
            recorded.append(rule["record"])
