"""mfuscope's recording rules: the job-level series the dashboards and alerts read, each built
from the one PromQL definition of its quantity (`mfuscope.core.promql.quantities`).

deploy/prometheus/rules/mfuscope-recording.yml is `text()`, written by
deploy/prometheus/build_rules.py; a test fails when the shipped file differs. The names below are
public (alerts, dashboards, the promtool tests, users' own dashboards): never rename one.
"""

from __future__ import annotations

from mfuscope.core.promql._rules_arrivals import arrivals_group
from mfuscope.core.promql._rules_collectives import collective_rules
from mfuscope.core.promql._rules_hangs import hangs_group
from mfuscope.core.promql._rules_job import (
    step_rules,
    straggler_rules,
    utilisation_rules,
    waterfall_rules,
)
from mfuscope.core.promql._rules_job_time import job_time_group
from mfuscope.core.promql._rules_regression import regression_group, restarts_group
from mfuscope.core.promql._rules_run_baseline import run_baseline_group
from mfuscope.core.promql.rules_file import Group, Rule, render, without_fresh_reads

__all__ = ["GROUPS", "HEADER", "WRITTEN_GROUPS", "WRITTEN_OUT", "recorded_rules", "text"]

HEADER = (
    "mfuscope recording rules: the job-level series that the dashboards and alerts read.\n"
    "\n"
    "Generated from mfuscope.core.promql (core/promql/), where each quantity's PromQL is "
    "written once for these rules and the dashboards alike; edit there and run "
    "`python deploy/prometheus/build_rules.py`. A test fails when this file differs.\n"
    "\n"
    "Naming follows Prometheus's `level:metric:operations` convention "
    "(https://prometheus.io/docs/practices/rules/): `job:` = aggregated to the training job, "
    "`job_component:` = per job and step component, and so on. Ratios are 0..1, rates per "
    "second.\n"
    "\n"
    "Inputs are the collector's counters and gauges (docs/reference/metrics.md). Every job-level "
    "ratio is a ratio of sums, so it is exact across ranks, nodes and collectors: never an "
    "average of per-rank ratios. Denominators are guarded with `> 0` so an idle or unknown job "
    "yields no sample rather than +Inf or NaN."
)

# The groups as written, each rule from the one definition of its quantity; a rule may read one
# above it.
WRITTEN_GROUPS: tuple[Group, ...] = (
    Group(
        "mfuscope.job",
        (
            *utilisation_rules(),
            *step_rules(),
            *waterfall_rules(),
            *collective_rules(),
            *straggler_rules(),
        ),
    ),
    regression_group(),
    restarts_group(),
    hangs_group(),
    arrivals_group(),
    run_baseline_group(),
    job_time_group(),
)
# The groups whose rules are written out from the raw series as shipped (`without_fresh_reads`),
# so vmalert gives what Prometheus gives: their 5 min ratios move by much more in one evaluation
# than a ratio may be off. The others read their own results over 15 min to 30 days (the job-time
# budgets over 1 h), where the previous evaluation's value differs by at most interval / window
# (15 s / 15 min: 1.7 %), and written out they would cost about three times the evaluation (the
# 6 h and 30 d ranges computed once per reading rule).
WRITTEN_OUT: tuple[str, ...] = (
    "mfuscope.job",
    "mfuscope.restarts",
    "mfuscope.hangs",
    "mfuscope.arrivals",
)
GROUPS: tuple[Group, ...] = tuple(
    without_fresh_reads(group) if group.name in WRITTEN_OUT else group for group in WRITTEN_GROUPS
)


def recorded_rules() -> tuple[Rule, ...]:
    """Every recording rule, in file order."""
    return tuple(rule for group in GROUPS for rule in group.rules)


def text() -> str:
    """The text of deploy/prometheus/rules/mfuscope-recording.yml."""
    return render(HEADER, GROUPS)
