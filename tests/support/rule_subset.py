"""A promtool rule test file with only the rules its checks read, for the suite to run.

promtool evaluates every rule of every loaded file at every evaluation step of a test group, so a
test of two alerts pays for all 88 rules: on 2 cores the regression file took 15.5 s, 5.3 s with
the 11 rules it reads. `subset_suite` writes a copy of a test file whose `rule_files` hold only the
rules its checks read, directly or through other recorded series: the alerts its
`alert_rule_test` cases name or its expressions read through ``ALERTS`` (all of them where no
``alertname`` matcher narrows it), and the recording rules whose series those alerts and its
`promql_expr_test` expressions read, transitively. Every kept rule stays in its group, in its
order, so each evaluates exactly as in the whole file; a rule left out records a series nothing
checked reads. A series is read by its name in an expression, or through a ``__name__`` equality
or regex matcher, which keeps every recorded series it matches (any other ``__name__`` matcher is
an error here).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

__all__ = ["kept_rules", "subset_suite"]

# Identifiers in a PromQL expression: metric names, and also functions, labels and keywords, which
# name no recorded series and so keep nothing.
_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")


_BY_NAME = re.compile(r'__name__\s*(=~|!~|!=|=)\s*"([^"]*)"')


def _names(expr: str, records: set[str]) -> set[str]:
    """The series names `expr` reads: the identifiers in it, and the `records` that a
    ``__name__="..."`` or ``__name__=~"..."`` matcher selects."""
    names = set(_NAME.findall(expr))
    for op, value in _BY_NAME.findall(expr):
        if op not in ("=", "=~"):
            raise ValueError(f"a negative __name__ matcher; subsets cannot follow it: {expr}")
        names |= {name for name in records if re.fullmatch(value, name)}
    if expr.count("__name__") != len(_BY_NAME.findall(expr)):
        raise ValueError(f"a __name__ matcher subsets cannot read: {expr}")
    return names


_ALERTNAME = re.compile(r'alertname\s*(=~|!~|!=|=)\s*"([^"]*)"')


def _alerts_read(expr: str, alerts: set[str]) -> set[str]:
    """The `alerts` whose ``ALERTS`` / ``ALERTS_FOR_STATE`` series `expr` reads: those its
    ``alertname`` equality or regex matchers select, every alert without such a matcher (a
    check that no alert fired for a job must see them all)."""
    if not {"ALERTS", "ALERTS_FOR_STATE"} & set(_NAME.findall(expr)):
        return set()
    matchers = _ALERTNAME.findall(expr)
    if not matchers or any(op not in ("=", "=~") for op, _ in matchers):
        return set(alerts)
    return {name for name in alerts for _, value in matchers if re.fullmatch(value, name)}


def kept_rules(suite: dict[str, Any], rule_docs: dict[str, dict[str, Any]]) -> set[int]:
    """`id`s of the rules in `rule_docs` (file -> parsed rule file) that `suite` (a parsed
    promtool test file) reads."""
    rules = [
        rule for doc in rule_docs.values() for group in doc["groups"] for rule in group["rules"]
    ]
    records = {rule["record"] for rule in rules if "record" in rule}
    every_alert = {rule["alert"] for rule in rules if "alert" in rule}
    alerts: set[str] = set()
    wanted: set[str] = set()
    for case in suite["tests"]:
        alerts |= {check["alertname"] for check in case.get("alert_rule_test") or []}
        for check in case.get("promql_expr_test") or []:
            wanted |= _names(check["expr"], records)
            alerts |= _alerts_read(check["expr"], every_alert)
    kept = {id(rule) for rule in rules if rule.get("alert") in alerts}
    todo = [name for rule in rules if id(rule) in kept for name in _names(rule["expr"], records)]
    todo += wanted
    seen: set[str] = set()
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        for rule in rules:
            if rule.get("record") == name and id(rule) not in kept:
                kept.add(id(rule))
                todo += _names(rule["expr"], records)
    return kept


def subset_suite(test_file: Path, out_dir: Path) -> Path:
    """Write `test_file` and the subsets of its rule files into `out_dir` (created); the path of
    the copy to hand to ``promtool test rules``."""
    out_dir.mkdir(parents=True, exist_ok=True)
    suite = yaml.safe_load(test_file.read_text(encoding="utf-8"))
    sources = {name: (test_file.parent / name).resolve() for name in suite["rule_files"]}
    rule_docs = {
        name: yaml.safe_load(path.read_text(encoding="utf-8")) for name, path in sources.items()
    }
    kept = kept_rules(suite, rule_docs)
    written = []
    for name, doc in rule_docs.items():
        groups = [
            {**group, "rules": [rule for rule in group["rules"] if id(rule) in kept]}
            for group in doc["groups"]
        ]
        path = out_dir / sources[name].name
        path.write_text(
            yaml.safe_dump({"groups": [g for g in groups if g["rules"]]}, sort_keys=False),
            encoding="utf-8",
        )
        written.append(str(path))
    suite["rule_files"] = written
    copy = out_dir / test_file.name
    copy.write_text(yaml.safe_dump(suite, sort_keys=False), encoding="utf-8")
    return copy
