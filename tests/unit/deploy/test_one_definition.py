"""One definition per quantity in PromQL: the shipped recording rules are what
`mfuscope.core.promql` writes, and no rule, alert or dashboard query holds a formula over the
collector's counters that did not come from `mfuscope.core.promql.quantities`.

How the scan tells a generated formula from a hand-written one: every expression is put in a
canonical shape (label matchers, ranges, offsets and grouping labels dropped: they choose what a
formula applies to, not the formula), and so is every expression the definitions produce. An
expression that reads one of the counters the definitions divide (`FORMULA_INPUTS`) must then be
one of those shapes, whole: a copy that differs in any operator, guard or clamp does not match.
"""

from __future__ import annotations

import importlib.util
import json
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType

import pytest
import yaml
from mfuscope.core.promql import names as n
from mfuscope.core.promql import quantities as q
from mfuscope.core.promql import recording
from mfuscope.core.promql.syntax import total

ROOT = Path(__file__).resolve().parents[3]
RULES = ROOT / "deploy" / "prometheus" / "rules"
RECORDING = RULES / "mfuscope-recording.yml"
DASHBOARDS = sorted((ROOT / "dashboards").glob("*.json"))
BUILD_RULES = ROOT / "deploy" / "prometheus" / "build_rules.py"

_RECORDED = re.compile(r"\b[a-z_]+:mfuscope_[a-z0-9_]+:[a-z0-9_]+\b")
_CANONICAL: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"\{[^{}]*\}"), ""),  # label matchers
    (re.compile(r"\[[^\[\]]*\]"), "[]"),  # ranges
    (re.compile(r" offset \w+"), ""),
    (re.compile(r"\bincrease\("), "rate("),  # a ratio of two changes is the same either way
    (re.compile(r"\b(sum|max|min|count|avg|quantile) (?:by|without) \([^()]*\) \("), r"\1("),
    (re.compile(r" on \([^()]*\) group_left \(\)"), " on group_left"),
    (re.compile(r" on \([^()]*\)"), " on"),
    (_RECORDED, "R"),
)


def canonical(expr: str) -> str:
    """`expr` with what selects its data dropped, so equal formulas compare equal."""
    text = " ".join(expr.split())
    for pattern, replacement in _CANONICAL:
        text = pattern.sub(replacement, text)
    return text


W = q.RATE_5M
R = n.MFU_5M  # any recorded series: the canonical shape names them all R
# Every public function of the definitions, with the arguments that change a formula's shape
# (grouping with or without `per`); the rest only select data.
_CALLS: dict[str, list[Callable[[], str]]] = {
    "mfu": [lambda: q.mfu(W)],
    "hfu": [lambda: q.hfu(W)],
    "utilization": [lambda: q.utilization(R, R)],
    "step_seconds": [lambda: q.step_seconds(W)],
    "step_fraction": [
        lambda c=c, per=per: q.step_fraction(c, W, per=per)  # type: ignore[misc]
        for c in sorted(q.FORMULA_INPUTS)
        for per in ((), ("component",))
    ],
    "bucket_fraction": [lambda: q.bucket_fraction(W), lambda: q.bucket_fraction(W, per=("a",))],
    "bubble_matcher": [],  # a label matcher, not an expression
    "elementwise_fraction": [lambda: q.elementwise_fraction(W)],
    "elementwise_slice": [lambda: q.elementwise_slice(W, R)],
    "kernel_efficiency": [lambda: q.kernel_efficiency(R, R)],
    "kernel_inefficiency": [lambda: q.kernel_inefficiency(R, R, R)],
    "waterfall": [lambda: q.waterfall(R, R, R)],
    "waterfall_slices": [lambda: q.waterfall_slices(W, R)],
    "mean_step_seconds": [lambda: q.mean_step_seconds(W)],
    "own_step_seconds": [lambda: q.own_step_seconds(W, ("job",))],
    "running_seconds": [lambda: q.running_seconds(W)],
    "busbw": [lambda: q.busbw(W, ("job",))],
    "mean_message_bytes": [lambda: q.mean_message_bytes(W, ("job",))],
    "collective_overlap": [lambda: q.collective_overlap(W, ("job",))],
    "tier_spec": [lambda: q.tier_spec()],
    "busbw_efficiency": [lambda: q.busbw_efficiency(R)],
    "effective_mfu": [lambda: q.effective_mfu(W), lambda: q.effective_mfu(None)],
    "job_time_share": [lambda: q.job_time_share(W)],
}


def _shapes() -> set[str]:
    shapes = {canonical(call()) for calls in _CALLS.values() for call in calls}
    # A plain sum of one counter's change (a recorded FLOP/s or bytes/s) is no formula.
    shapes |= {canonical(total(W.of(counter), ("job",))) for counter in q.FORMULA_INPUTS}
    return shapes


def is_generated(expr: str, shapes: set[str]) -> bool:
    """`expr` reads no formula input, or is one definition's shape, whole."""
    if not any(re.search(rf"\b{counter}\b", expr) for counter in q.FORMULA_INPUTS):
        return True
    return canonical(expr) in shapes


def _shipped_expressions() -> Iterator[tuple[str, str]]:
    """(where, expression) for every rule and alert and every dashboard query."""
    # The recording rules as core writes them: the shipped file writes out each read of an
    # earlier rule of the group (`without_fresh_reads`, tested in tests/unit/core/test_promql.py),
    # and is what core writes (test below).
    for group in recording.WRITTEN_GROUPS:
        for rule in group.rules:
            yield f"{RECORDING.name} {rule.record}", rule.expr
    for path in sorted(RULES.glob("*.yml")):
        if path == RECORDING:
            continue
        for group in yaml.safe_load(path.read_text(encoding="utf-8"))["groups"]:
            for rule in group["rules"]:
                yield f"{path.name} {rule.get('record') or rule['alert']}", rule["expr"]
    for path in DASHBOARDS:
        dashboard = json.loads(path.read_text(encoding="utf-8"))
        for panel in dashboard["panels"]:
            for target in panel.get("targets", []):
                yield f"{path.stem} / {panel['title']} / {target['refId']}", target["expr"]


def _build_rules() -> ModuleType:
    spec = importlib.util.spec_from_file_location("build_rules", BUILD_RULES)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_shipped_recording_rules_are_what_core_writes(tmp_path: Path) -> None:
    assert RECORDING.read_text(encoding="utf-8") == recording.text(), (
        "regenerate: python deploy/prometheus/build_rules.py"
    )
    # And the generator's check is real: a stale file is reported, a current one is not.
    build = _build_rules()
    stale = tmp_path / "rules.yml"
    stale.write_text(RECORDING.read_text(encoding="utf-8").replace("[5m]", "[4m]", 1))
    assert build.main(["--check", "--output", str(stale)]) == 1
    assert build.main(["--check", "--output", str(RECORDING)]) == 0


def test_the_rule_file_loads_back_to_the_expressions_it_was_written_from() -> None:
    loaded = [
        (rule["record"], rule["expr"], rule.get("labels", {}))
        for group in yaml.safe_load(recording.text())["groups"]
        for rule in group["rules"]
    ]
    written = [(r.record, r.expr, dict(r.labels)) for r in recording.recorded_rules()]
    assert loaded == written


def test_the_recorded_names_the_dashboards_use_are_recorded() -> None:
    recorded = {rule.record for rule in recording.recorded_rules()}
    public = {value for name, value in vars(n).items() if name.isupper() and name != "__all__"}
    assert public and public <= recorded, sorted(public - recorded)


def test_every_definition_is_listed_for_the_scan() -> None:
    functions = {name for name in q.__all__ if callable(getattr(q, name))}
    assert functions == set(_CALLS)


def test_no_shipped_query_holds_its_own_copy_of_a_formula() -> None:
    shapes = _shapes()
    checked = 0
    copies = []
    for where, expr in _shipped_expressions():
        if any(re.search(rf"\b{counter}\b", expr) for counter in q.FORMULA_INPUTS):
            checked += 1
        if not is_generated(expr, shapes):
            copies.append((where, expr))
    assert not copies, copies
    # The scan saw the rules' and the dashboards' formulas (not a vacuous pass).
    assert checked >= 30, checked


@pytest.mark.parametrize(
    "copy",
    [
        # MFU without the `> 0` guard: +Inf for a job whose peak is unknown.
        'sum(rate(mfuscope_model_flops_total{job=~"$job"}[5m]))'
        ' / sum(rate(mfuscope_peak_flop_seconds_total{job=~"$job"}[5m]))',
        # The kernel slice clamped at 0.
        "clamp_min("
        + q.kernel_inefficiency(q.bucket_fraction(W, part='component="compute"'), R, R)
        + ", 0)",
        # busbw as a mean of per-series ratios instead of a ratio of sums.
        "avg(rate(mfuscope_collective_sized_bus_bytes_total[5m])"
        " / rate(mfuscope_collective_sized_seconds_total[5m]))",
        # A bucket fraction over the step counter instead of the sum of the buckets.
        'sum(rate(mfuscope_step_component_seconds_total{component="other"}[5m]))'
        " / (sum(rate(mfuscope_step_seconds_total[5m])) > 0)",
    ],
)
def test_the_scan_finds_hand_written_copies(copy: str) -> None:
    assert not is_generated(copy, _shapes())


def test_the_same_formula_with_other_matchers_and_windows_is_the_definition() -> None:
    shapes = _shapes()
    assert is_generated(q.mfu(q.DASHBOARD_RATE, (), 'job=~"$job"'), shapes)
    assert is_generated(q.waterfall_slices(q.INCREASE_6H_BASELINE, n.MFU_BASELINE_6H), shapes)


def test_no_waterfall_slice_is_clamped_anywhere() -> None:
    """Core keeps a negative kernel slice (it shows overcounted FLOPs or an understated peak);
    the rules and dashboards show it the same way."""
    clamped = [(where, expr) for where, expr in _shipped_expressions() if "clamp" in expr]
    assert not clamped, clamped
