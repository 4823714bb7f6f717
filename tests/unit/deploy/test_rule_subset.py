"""`tests/support/rule_subset.py`: which rules a promtool test file's checks read."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support.rule_subset import kept_rules, subset_suite

ROOT = Path(__file__).resolve().parents[3]
TESTS = ROOT / "deploy" / "prometheus" / "tests"

RULES = {
    "r.yml": {
        "groups": [
            {
                "name": "g",
                "rules": [
                    {"record": "job:a:sum", "expr": "sum by (job) (raw_a)"},
                    {"record": "job:b:sum", "expr": "sum by (job) (raw_b)"},
                    {"record": "job:a:ratio", "expr": "job:a:sum / job:b:sum"},
                    {"record": "job:c:sum", "expr": "sum by (job) (raw_c)"},
                    {"alert": "ALow", "expr": "job:a:ratio < 0.5"},
                    {"alert": "CHigh", "expr": "job:c:sum > 1"},
                ],
            }
        ]
    }
}


def _kept(*, alerts: tuple[str, ...] = (), exprs: tuple[str, ...] = ()) -> set[str]:
    suite: dict[str, Any] = {
        "tests": [
            {
                "alert_rule_test": [{"alertname": a} for a in alerts],
                "promql_expr_test": [{"expr": e} for e in exprs],
            }
        ]
    }
    ids = kept_rules(suite, RULES)
    rules = RULES["r.yml"]["groups"][0]["rules"]
    return {r.get("record") or r["alert"] for r in rules if id(r) in ids}


def test_an_alert_keeps_the_records_it_reads_transitively() -> None:
    assert _kept(alerts=("ALow",)) == {"ALow", "job:a:ratio", "job:a:sum", "job:b:sum"}


def test_an_expression_keeps_what_it_names_or_matches_by_name() -> None:
    assert _kept(exprs=("job:c:sum",)) == {"job:c:sum"}
    assert _kept(exprs=('{__name__=~"job:.:sum"}',)) == {"job:a:sum", "job:b:sum", "job:c:sum"}
    with pytest.raises(ValueError, match="negative __name__"):
        _kept(exprs=('{__name__!~"job:.*"}',))


def test_reading_alerts_keeps_the_alerts_it_selects_or_all() -> None:
    assert _kept(exprs=('ALERTS{alertname="CHigh"}',)) == {"CHigh", "job:c:sum"}
    # "no alert fired for this job" must see every alert
    assert {"ALow", "CHigh"} <= _kept(exprs=('count_over_time(ALERTS{job="x"}[5m])',))


def test_the_regression_file_keeps_its_alert_and_figure(tmp_path: Path) -> None:
    copy = subset_suite(TESTS / "regression_test.yml", tmp_path)
    suite = yaml.safe_load(copy.read_text())
    kept = [
        rule.get("record") or rule.get("alert")
        for path in suite["rule_files"]
        for group in yaml.safe_load(Path(path).read_text())["groups"]
        for rule in group["rules"]
    ]
    assert "MFUScopeMFURegression" in kept and "job:mfuscope_mfu_regression:ratio" in kept
    assert len(kept) < 30  # of 88: the point of the subset
    original = yaml.safe_load((TESTS / "regression_test.yml").read_text())
    assert suite["tests"] == original["tests"]
