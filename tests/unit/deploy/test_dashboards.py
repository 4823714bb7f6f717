"""The Grafana dashboards: generated JSON up to date, valid Grafana 11.6, every panel explained.

Validation uses the Grafana 11.6 JSON schemas in ../shared/grafana-schema (no Grafana server can
run here). Three places where those schemas are stricter than Grafana itself are relaxed, each
narrowly (see `_grafana_relaxations`).
"""

from __future__ import annotations

import copy
import json
import os
import re
import subprocess
import sys
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from tests.support.shared_data import GRAFANA_SCHEMAS, require

ROOT = Path(__file__).resolve().parents[3]
DASHBOARD_DIR = ROOT / "dashboards"
RULES_DIR = ROOT / "deploy" / "prometheus" / "rules"
DASHBOARD_FILES = sorted(DASHBOARD_DIR.glob("*.json"))
EXPECTED_FILES = {"mfuscope-fleet.json", "mfuscope-job.json", "mfuscope-communication.json"}

Json = dict[str, Any]


def _load(path: Path) -> Json:
    data: Json = json.loads(path.read_text(encoding="utf-8"))
    return data


@cache
def _schema(name: str) -> Json:
    return _load(require(GRAFANA_SCHEMAS / f"{name}.jsonschema.json"))


def _grafana_relaxations(schema: Json) -> Json:
    """The dashboard schema, relaxed where it is stricter than Grafana's own serialisation.

    1. Threshold.value: the base step is `null` (its own description: "Nulls currently appear
       here when serializing -Infinity to JSON"); Grafana writes it that way.
    2. MatcherConfig.options and 3. DynamicConfigValue.value: CUE's `_` (any) was rendered as
       `object`, but grafana-foundation-sdk of the same commit emits strings there
       (`override_by_name` -> {"id": "byName", "options": "<name>"}), as Grafana does. The test
       `test_overrides_use_known_matchers_and_properties` checks what we put there instead.
    """
    relaxed = copy.deepcopy(schema)
    definitions = relaxed["definitions"]
    definitions["Threshold"]["properties"]["value"] = {"type": ["number", "null"]}
    definitions["MatcherConfig"]["properties"]["options"] = {}
    definitions["DynamicConfigValue"]["properties"]["value"] = {}
    return relaxed


def _panels(dashboard: Json) -> list[Json]:
    return [p for p in dashboard["panels"] if p["type"] != "row"]


def _exprs(dashboard: Json) -> list[str]:
    return [t["expr"] for p in _panels(dashboard) for t in p["targets"]]


def _recorded_and_alerts() -> tuple[set[str], list[Json]]:
    recorded: set[str] = set()
    alerts: list[Json] = []
    for path in sorted(RULES_DIR.glob("*.yml")):
        for group in yaml.safe_load(path.read_text(encoding="utf-8"))["groups"]:
            for rule in group["rules"]:
                if "record" in rule:
                    recorded.add(rule["record"])
                else:
                    alerts.append(rule)
    return recorded, alerts


def _contract_metrics() -> set[str]:
    """Metric names in the metric contract (docs/reference/metrics.md, first column)."""
    table = (ROOT / "docs" / "reference" / "metrics.md").read_text(encoding="utf-8")
    return set(re.findall(r"^\| `(mfuscope_[a-z0-9_]+)` \|", table, flags=re.MULTILINE))


def test_the_three_dashboards_are_checked_in() -> None:
    assert {p.name for p in DASHBOARD_FILES} == EXPECTED_FILES


@pytest.mark.slow  # the generator in a child process
def test_checked_in_json_is_what_the_generator_produces(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
    build = [sys.executable, str(DASHBOARD_DIR / "generator" / "build.py")]
    check = subprocess.run([*build, "--check"], capture_output=True, text=True, env=env)
    assert check.returncode == 0, check.stderr
    # And the check is real: a stale file is reported.
    for name in EXPECTED_FILES:
        (tmp_path / name).write_text("{}\n", encoding="utf-8")
    stale = subprocess.run(
        [*build, "--check", "--output-dir", str(tmp_path)], capture_output=True, text=True, env=env
    )
    assert stale.returncode == 1 and "stale" in stale.stderr


@pytest.mark.parametrize("path", DASHBOARD_FILES, ids=lambda p: p.stem)
def test_dashboard_validates_against_grafana_11_6_schema(path: Path) -> None:
    validator = jsonschema.Draft7Validator(_grafana_relaxations(_schema("dashboard")))
    errors = [
        f"{list(e.absolute_path)}: {e.message[:200]}" for e in validator.iter_errors(_load(path))
    ]
    assert not errors, errors


@pytest.mark.parametrize("path", DASHBOARD_FILES, ids=lambda p: p.stem)
def test_panel_options_and_targets_validate_against_their_plugin_schemas(path: Path) -> None:
    errors = []
    target_validator = jsonschema.Draft7Validator(_schema("prometheus"))
    for panel in _panels(_load(path)):
        definitions = _schema(panel["type"])["definitions"]
        parts = {
            "Options": panel.get("options"),
            "FieldConfig": panel["fieldConfig"]["defaults"].get("custom"),
        }
        for definition, value in parts.items():
            if value is None:
                continue
            assert definition in definitions, f"{panel['type']} schema lacks {definition}"
            validator = jsonschema.Draft7Validator(
                {**definitions[definition], "definitions": definitions}
            )
            errors += [
                f"{panel['title']}: {definition}: {e.message}" for e in validator.iter_errors(value)
            ]
        for target in panel["targets"]:
            errors += [
                f"{panel['title']}: target: {e.message}"
                for e in target_validator.iter_errors(target)
            ]
    assert not errors, errors


@pytest.mark.parametrize("path", DASHBOARD_FILES, ids=lambda p: p.stem)
def test_every_panel_is_explained_and_queries_the_selected_data_source(path: Path) -> None:
    dashboard = _load(path)
    titles = [p["title"] for p in _panels(dashboard)]
    assert len(titles) == len(set(titles)), "panel titles must be unique within a dashboard"
    for panel in _panels(dashboard):
        title = panel["title"]
        assert panel.get("description"), f"{title}: no description"
        assert panel["fieldConfig"]["defaults"].get("unit"), f"{title}: no unit"
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, title
        assert panel["targets"], f"{title}: no query"
        assert panel["fieldConfig"]["defaults"]["thresholds"]["steps"], f"{title}: no thresholds"
        refs = [t["refId"] for t in panel["targets"]]
        assert len(refs) == len(set(refs)), f"{title}: duplicate refId"


@pytest.mark.parametrize("path", DASHBOARD_FILES, ids=lambda p: p.stem)
def test_descriptions_state_the_panel_colours_and_real_alerts(path: Path) -> None:
    """A colour threshold a description states ("red below 30 %", "red from 90 s") is one of the
    panel's threshold steps, and an alert it names is one of our alert rules."""
    _, alerts = _recorded_and_alerts()
    alert_names = {rule["alert"] for rule in alerts}
    stated_any = False
    for panel in _panels(_load(path)):
        description = panel.get("description", "")
        steps = {
            step["value"]
            for step in panel["fieldConfig"]["defaults"]["thresholds"]["steps"]
            if step.get("value") is not None
        }
        for number, unit in re.findall(
            r"\b(?:red|amber|dark red) (?:below|from|above) ([0-9.]+) ?(%|s\b)?",
            description,
            flags=re.IGNORECASE,
        ):
            stated_any = True
            value = float(number) / 100 if unit == "%" else float(number)
            assert any(abs(value - step) < 1e-9 for step in steps), (panel["title"], number, steps)
        for named in re.findall(r"\bMFUScope\w+", description):
            assert named in alert_names, f"{panel['title']} names unknown alert {named}"
    assert stated_any, f"{path.stem}: no panel states its colour thresholds"


@pytest.mark.parametrize("path", DASHBOARD_FILES, ids=lambda p: p.stem)
def test_layout_ids_and_grid(path: Path) -> None:
    dashboard = _load(path)
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids)) and all(i > 0 for i in ids)
    for panel in dashboard["panels"]:
        grid = panel["gridPos"]
        assert grid["x"] + grid["w"] <= 24 and grid["h"] > 0, panel["title"]
    assert dashboard["uid"] == path.stem
    assert "mfuscope" in dashboard["tags"]


@pytest.mark.parametrize("path", DASHBOARD_FILES, ids=lambda p: p.stem)
def test_template_variables(path: Path) -> None:
    variables = {v["name"]: v for v in _load(path)["templating"]["list"]}
    assert list(variables) == ["datasource", "job", "axis", "tier"]
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    for name in ("job", "axis", "tier"):
        assert variables[name]["type"] == "query"
        assert variables[name]["query"].startswith("label_values(")
        assert variables[name]["datasource"]["uid"] == "${datasource}"
    for name in ("axis", "tier"):
        assert variables[name]["includeAll"] and variables[name]["allValue"] == ".*"
    # One job at a time on the Job dashboard; any number elsewhere.
    assert variables["job"]["multi"] is (path.stem != "mfuscope-job")


def test_queries_use_only_published_series() -> None:
    """Every mfuscope name in a query is in the metric contract or recorded by our rules."""
    contract = _contract_metrics()
    recorded, _ = _recorded_and_alerts()
    # The contract table is found and complete: every raw series a recording rule reads is in it.
    rule_exprs = [r["expr"] for path in sorted(RULES_DIR.glob("*.yml"))
                  for g in yaml.safe_load(path.read_text(encoding="utf-8"))["groups"]
                  for r in g["rules"]]  # fmt: skip
    raw = {
        re.sub(r"_(bucket|count|sum)$", "", name)
        for expr in rule_exprs
        for name in re.findall(r"(?<![a-z_:])mfuscope_[a-z0-9_]+", expr)
    }
    assert raw and raw <= contract, sorted(raw - contract)
    known = contract | recorded
    unknown = set()
    for path in DASHBOARD_FILES:
        dashboard = _load(path)
        texts = _exprs(dashboard) + [v["query"] for v in dashboard["templating"]["list"]]
        for text in texts:
            for name in re.findall(r"[a-z_:]*mfuscope_[a-z0-9_:]*", text):
                base = re.sub(r"_(bucket|count|sum)$", "", name)
                if name not in known and base not in known:
                    unknown.add((path.stem, name))
    assert not unknown, sorted(unknown)


def test_job_queries_follow_the_job_variable() -> None:
    """Any query over mfuscope series restricts `job` to the selection (`job=~"$job"`)."""
    offenders = [
        (path.stem, expr)
        for path in DASHBOARD_FILES
        for expr in _exprs(_load(path))
        if "mfuscope_" in expr
        and any(
            selector.count('job=~"$job"') == 0
            for selector in re.findall(r"mfuscope_[a-z0-9_:]+(\{[^}]*\})?", expr)
        )
    ]
    assert not offenders, offenders


def _alert_thresholds() -> list[tuple[str, float]]:
    """(series the alert compares, threshold) for alerts of the form `<expr> > N` or `< N`."""
    _, alerts = _recorded_and_alerts()
    found = []
    for rule in alerts:
        first_clause = re.split(r"\s(?:and|unless|or)\s", rule["expr"])[0]
        match = re.search(
            r"([a-z_:]*mfuscope_[a-z0-9_:]+)[^<>]*[<>]=?\s*([0-9.]+)\s*$", first_clause
        )
        # `> 0` alerts (a flag set, a counter moved) have no band edge to agree with.
        if match and float(match.group(2)) > 0:
            found.append((match.group(1), float(match.group(2))))
    return found


def test_colour_bands_agree_with_alert_thresholds() -> None:
    """A panel that colours a series an alert watches has a band edge at the alert threshold."""
    checked = 0
    mismatches = []
    for series, threshold in _alert_thresholds():
        for path in DASHBOARD_FILES:
            for panel in _panels(_load(path)):
                steps = panel["fieldConfig"]["defaults"]["thresholds"]["steps"]
                edges = [s["value"] for s in steps if s["value"] is not None]
                if not edges or not any(
                    re.search(rf"\b{re.escape(series)}\b", t["expr"]) for t in panel["targets"]
                ):
                    continue
                checked += 1
                if not any(abs(edge - threshold) < 1e-9 for edge in edges):
                    mismatches.append((path.stem, panel["title"], series, threshold, edges))
    assert checked >= 4, "the consistency check matched too few panels to mean anything"
    assert not mismatches, mismatches


def test_overrides_use_known_matchers_and_properties() -> None:
    """What the relaxed schema parts may contain: Grafana's byName/byRegexp matchers with a
    string, and properties whose value type Grafana expects."""
    property_types: dict[str, type | tuple[type, ...]] = {
        "unit": str,
        "custom.lineStyle": dict,
        "custom.fillOpacity": (int, float),
        "custom.stacking": dict,
        "custom.cellOptions": dict,
    }
    for path in DASHBOARD_FILES:
        for panel in _panels(_load(path)):
            for override in panel["fieldConfig"]["overrides"]:
                matcher = override["matcher"]
                assert matcher["id"] in ("byName", "byRegexp"), matcher
                assert isinstance(matcher["options"], str) and matcher["options"]
                if matcher["id"] == "byRegexp":
                    re.compile(matcher["options"])
                for prop in override["properties"]:
                    assert prop["id"] in property_types, prop
                    assert isinstance(prop["value"], property_types[prop["id"]]), prop


def test_core_panels_exist() -> None:
    """The panels the end-to-end test requires data from (MFU, HFU, decomposition, busbw)."""
    titles = {path.stem: {p["title"] for p in _panels(_load(path))} for path in DASHBOARD_FILES}
    assert {"MFU per job", "HFU per job"} <= titles["mfuscope-fleet"]
    assert {"MFU and HFU", "Step decomposition"} <= titles["mfuscope-job"]
    assert "Bus bandwidth by tier and op" in titles["mfuscope-communication"]


@pytest.mark.slow  # mypy in a child process
def test_generator_is_typed_strictly(tmp_path: Path) -> None:
    """The generators (dashboards, recording rules) are not packages, so the suite's mypy run
    does not see them: check them here, with `mfuscope.core` (whose PromQL definitions they
    import) laid out on disk as mypy needs it, as the editable install does not."""
    generator = sorted(str(p) for p in (DASHBOARD_DIR / "generator").glob("*.py"))
    generator.append(str(ROOT / "deploy" / "prometheus" / "build_rules.py"))
    (tmp_path / "path" / "mfuscope").mkdir(parents=True)
    (tmp_path / "path" / "mfuscope" / "core").symlink_to(ROOT / "core")
    mypy = [sys.executable, "-m", "mypy", "--config-file", str(ROOT / "pyproject.toml")]
    result = subprocess.run(
        [*mypy, "--cache-dir", str(tmp_path / "mypy"), *generator],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**os.environ, "MYPYPATH": str(tmp_path / "path")},
    )
    assert result.returncode == 0, result.stdout + result.stderr
