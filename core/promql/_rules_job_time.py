"""The rule group mfuscope.job_time: the job-time ledger's shares, effective MFU, and the budgets
MFUScopeJobTimeLost compares (docs/definitions.md#job-time-ledger, docs/operations.md)."""

from __future__ import annotations

from mfuscope.core.promql import names as n
from mfuscope.core.promql import quantities as q
from mfuscope.core.promql.rules_file import Group, Rule, Section
from mfuscope.core.promql.syntax import selector

__all__ = ["BUDGETS", "job_time_group"]

# The budget groups the alert holds each job to, each with the categories it counts together
# (the alert's thresholds: checkpoint 10 %, restart 10 %, hung any). The rule names the largest
# category of the group as the cause.
BUDGETS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("checkpoint", ("checkpoint_save", "checkpoint_load")),
    ("restart", ("startup", "down")),
    ("hung", ("hung",)),
)


def _budget(name: str, categories: tuple[str, ...]) -> str:
    """The group's share of the job's rank-seconds over the last hour, labelled ``budget`` and
    ``category`` (the largest of its categories)."""
    shares = selector(n.JOB_TIME_SHARE_1H, f'category=~"{"|".join(categories)}"')
    largest = f"topk by (job) (1, {shares})"
    value = f"{largest} * 0 + on (job) group_left () sum by (job) ({shares})"
    return f'label_replace({value}, "budget", "{name}", "", "")'


def job_time_group() -> Group:
    # Only jobs whose counters existed an hour ago (every job exports its restart counter, 0 or
    # more, from its first batch on): a young job's startup is most of its short life.
    aged = "max by (job) (mfuscope_job_restarts_total offset 1h)"
    budgets = " or ".join(_budget(name, categories) for name, categories in BUDGETS)
    return Group(
        "mfuscope.job_time",
        (
            Section(
                "job-time ledger (docs/definitions.md#job-time-ledger)",
                "Every rank-second of the job from its processes' starts to their exits, in one "
                "category each (startup, step, redone_step, the phases, hung, down, shutdown): "
                "shares of a ratio of sums, exact across ranks and collectors.",
            ),
            Rule(
                n.JOB_TIME_SHARE_1H,
                q.job_time_share(q.INCREASE_1H),
                "Each category's share of the job's rank-seconds over the last hour.",
            ),
            Rule(
                n.JOB_TIME_BUDGET_1H,
                f"({budgets}) and on (job) {aged}",
                "The budget groups of MFUScopeJobTimeLost over the last hour: checkpoint "
                "(checkpoint_save + checkpoint_load), restart (startup + down), hung; label "
                "category names the group's largest category. Only for jobs whose counters "
                "existed an hour ago.",
            ),
            Rule(
                n.EFFECTIVE_MFU,
                q.effective_mfu(None),
                "Effective MFU over the job's life as the collectors saw it "
                "(docs/definitions.md#effective-mfu): useful model FLOPs over the peak x every "
                "rank-second, startup and down included: about the steps' MFU times the useful "
                "steps' share of the rank-seconds.",
            ),
            Rule(
                n.EFFECTIVE_MFU_1H, q.effective_mfu(q.INCREASE_1H), "The same over the last hour."
            ),
        ),
        comment=(
            "The job's time, not only its steps: where every rank-second went, and effective "
            "MFU beside the steps' MFU. Over an hour a rule reading the one above it on vmalert "
            "(the previous evaluation's value) is off by at most interval / 1 h."
        ),
    )
