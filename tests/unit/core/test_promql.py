"""The PromQL definitions (`mfuscope.core.promql`): their text, their use of the vocabulary, and
the rule file writer (what it folds, YAML reads back unchanged)."""

from __future__ import annotations

import re

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st
from mfuscope.core.promql import quantities as q
from mfuscope.core.promql.rules_file import (
    WIDTH,
    Group,
    Rule,
    Section,
    render,
    without_fresh_reads,
)
from mfuscope.core.vocabulary import (
    BUBBLE_COMPONENTS,
    COMPONENTS,
    ELEMENTWISE_SLICE,
    KERNEL_INEFFICIENCY_SLICE,
    WAITING_COMPONENTS,
)


def test_mfu_is_a_guarded_ratio_of_sums() -> None:
    assert q.mfu(q.RATE_5M) == (
        "sum by (job) (rate(mfuscope_model_flops_total[5m]))"
        " / (sum by (job) (rate(mfuscope_peak_flop_seconds_total[5m])) > 0)"
    )
    assert q.mfu(q.INCREASE_6H_BASELINE, (), 'job=~"$job"') == (
        'sum(increase(mfuscope_model_flops_total{job=~"$job"}[6h] offset 30m))'
        ' / (sum(increase(mfuscope_peak_flop_seconds_total{job=~"$job"}[6h] offset 30m)) > 0)'
    )


def test_a_fraction_per_label_divides_by_the_step_time_of_its_job_only() -> None:
    expr = q.bucket_fraction(q.RATE_5M, per=("component",))
    assert " / on (job) group_left () (sum by (job) (rate(mfuscope_step_component" in expr
    assert expr.startswith("sum by (job, component) (")


def test_the_bubble_and_own_time_follow_the_vocabulary() -> None:
    (bubble,) = re.findall(r'component=~"([^"]*)"', q.bubble_matcher())
    assert set(bubble.split("|")) == set(BUBBLE_COMPONENTS) and set(BUBBLE_COMPONENTS) <= set(
        COMPONENTS
    )
    (waiting,) = re.findall(r'component!~"([^"]*)"', q.own_step_seconds(q.RATE_5M, ("job",)))
    assert set(waiting.split("|")) == WAITING_COMPONENTS


def test_the_waterfall_takes_every_bucket_but_compute_and_never_clamps() -> None:
    expr = q.waterfall_slices(q.RATE_5M, "job:mfuscope_mfu:ratio_rate5m")
    assert 'component!="compute"' in expr
    assert f'"component", "{ELEMENTWISE_SLICE}"' in expr
    assert f'"component", "{KERNEL_INEFFICIENCY_SLICE}"' in expr
    assert "clamp" not in expr
    assert "clamp" not in q.kernel_inefficiency("a", "b", "c")


def test_busbw_efficiency_divides_by_the_spec_of_its_axis_and_tier() -> None:
    assert q.busbw_efficiency("bw") == (
        "bw / on (job, axis, tier) group_left () (max by (job, axis, tier)"
        " (mfuscope_tier_peak_bandwidth_bytes_per_second) > 0)"
    )


def test_a_rule_expression_is_one_line() -> None:
    with pytest.raises(ValueError, match="one line"):
        Rule("job:mfuscope_x:y", "a\n/ b")
    with pytest.raises(ValueError, match="one line"):
        Rule("job:mfuscope_x:y", "a  / b")


_WORDS = st.sampled_from(
    [
        "sum",
        "by",
        "(job)",
        "(rate(mfuscope_model_flops_total[5m]))",
        '(rate(x{component="a",',
        'axis=~"b|c"}[5m]))',
        "/",
        "*",
        "-",
        "or",
        "and",
        "on",
        "(job,",
        "tier)",
        "group_left",
        "()",
        ">",
        "0)",
        "(",
        ")",
        "offset",
        "30m",
        '"",',
        "job:mfuscope_mfu:ratio_rate5m",
        "a" * 120,  # longer than a line: kept whole
    ]
)


@given(st.lists(_WORDS, min_size=1, max_size=80))
def test_a_folded_expression_reads_back_unchanged(words: list[str]) -> None:
    expr = " ".join(words)
    if not re.match(r"[A-Za-z0-9(]", expr):
        expr = "x " + expr
    text = render("header", [Group("g", [Section("s", "why"), Rule("job:mfuscope_x:y", expr)])])
    (group,) = yaml.safe_load(text)["groups"]
    assert group["rules"] == [{"record": "job:mfuscope_x:y", "expr": expr}]
    # A line is only ever too long for a word longer than it, or a chain of comparisons and
    # offsets glued to their operand (never broken between them).
    for line in text.splitlines():
        words = line.strip().removeprefix("expr: ").split(" ")
        assert len(line) <= WIDTH or all(w in (">", "offset") for w in words[:-1])


def test_without_fresh_reads_writes_a_read_of_an_earlier_rule_out() -> None:
    group = Group(
        "g",
        (
            Rule("job:a:rate5m", "sum by (job, component) (rate(x[5m]))"),
            Section("s"),
            Rule(
                "job:b:ratio_rate5m",
                'job:a:rate5m{component="c"} / job:a:rate5m{component!="c"}'
                " + last_over_time(job:a:rate5m[1h]) + job:a:rate5m_more",
            ),
        ),
    )
    (first, second) = without_fresh_reads(group).rules
    assert first.expr == "sum by (job, component) (rate(x[5m]))"
    inner = "(sum by (job, component) (rate(x[5m])))"
    only = 'label_replace(vector(1), "component", "c", "", "")'
    assert second.expr == (
        f"({inner} and on (component) {only}) / ({inner} unless on (component) {only})"
        " + last_over_time(job:a:rate5m[1h]) + job:a:rate5m_more"
    )
    with pytest.raises(ValueError, match="matcher"):
        without_fresh_reads(Group("g", (group.rules[0], Rule("r:x:y", 'job:a:rate5m{a=~"b"}'))))
    labelled = Rule("job:q:x", "vector(1)", labels={"quantile": "0.5"})
    with pytest.raises(ValueError, match="sets labels"):
        without_fresh_reads(Group("g", (labelled, Rule("r:x:y", "job:q:x * 2"))))


def test_without_fresh_reads_keeps_a_bare_group_modifier_apart_from_the_expression() -> None:
    group = Group(
        "g",
        (
            Rule("job:a:sum", "sum by (job, k) (x)"),
            Rule("job:b:diff", "sum by (k) (job:a:sum) - on (k) group_right job:a:sum"),
        ),
    )
    second = without_fresh_reads(group).rules[1]
    assert second.expr == (
        "sum by (k) ((sum by (job, k) (x))) - on (k) group_right () (sum by (job, k) (x))"
    )
