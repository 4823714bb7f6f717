"""Restarts: a re-sent report is ignored, a step a relaunched job runs again is new work.

The idempotency key is ``(job, incarnation, rank, step)``; see `mfuscope.collector._incarnations`
for the rules these tests hold the collector to.
"""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from mfuscope.collector import Aggregator, StateConfig
from mfuscope.collector._incarnations import KEEP, REMEMBER, JobIncarnations
from mfuscope.collector._summary import summary
from mfuscope.core.schema import SCHEMA_VERSION

from tests.support.collector_fakes import FakeClock, batch_dict

JOB = ("job-a",)


def _new(**config: Any) -> Aggregator:
    return Aggregator(StateConfig(**config), clock=FakeClock())


def _send(collector: Aggregator, incarnation: str | None, steps: list[int], rank: int = 0) -> Any:
    fields: dict[str, Any] = {} if incarnation is None else {"incarnation": incarnation}
    body = batch_dict(rank=rank, steps=steps, **fields)
    return collector.ingest(json.dumps(body).encode())


def _counters(collector: Aggregator) -> dict[str, float]:
    out = {}
    for family in collector.families():
        for sample in family.samples:
            if sample.labels == JOB:
                out[family.name] = sample.value
    return out


def test_a_relaunch_counts_its_redone_steps_as_work_and_as_reruns() -> None:
    collector = _new()
    first = _send(collector, "launch-1", list(range(10)))
    assert (first.accepted, first.duplicates, first.reruns) == (10, 0, 0)
    # Crashed after step 9; the relaunch resumes from the checkpoint at step 6.
    second = _send(collector, "launch-2", list(range(6, 14)))
    assert (second.accepted, second.duplicates, second.reruns) == (8, 0, 4)
    c = _counters(collector)
    assert c["mfuscope_steps_total"] == 18
    assert c["mfuscope_step_seconds_total"] == 18.0  # 1 s per step (`report_dict`)
    assert c["mfuscope_model_flops_total"] == 18 * 4e11
    assert c["mfuscope_rerun_steps_total"] == 4
    assert c["mfuscope_job_restarts_total"] == 1
    assert c["mfuscope_reports_duplicate_total"] == 0
    job = summary(collector.snapshot())["jobs"][0]
    assert (job["steps_total"], job["reports"]["reruns"], job["restarts"]) == (18, 4, 1)


def test_a_resent_batch_is_still_counted_once_in_either_incarnation() -> None:
    collector = _new()
    _send(collector, "launch-1", [1, 2, 3])
    assert _send(collector, "launch-1", [1, 2, 3]).duplicates == 3
    _send(collector, "launch-2", [2, 3, 4])
    again = _send(collector, "launch-2", [2, 3, 4])
    assert (again.accepted, again.duplicates, again.reruns) == (0, 3, 0)
    c = _counters(collector)
    assert c["mfuscope_steps_total"] == 6
    assert c["mfuscope_reports_duplicate_total"] == 6
    assert c["mfuscope_rerun_steps_total"] == 2
    assert c["mfuscope_job_restarts_total"] == 1


def test_late_batches_of_the_old_launch_are_deduplicated_against_their_own_launch() -> None:
    collector = _new()
    _send(collector, "launch-1", [0, 1, 2])
    _send(collector, "launch-2", [1, 2, 3])  # steps 1, 2 redone
    # Retries of the old launch land late: steps it had sent are re-sends, step 5 is new work,
    # and none is a rerun (that launch came first).
    late = _send(collector, "launch-1", [2, 5])
    assert (late.accepted, late.duplicates, late.reruns) == (1, 1, 0)
    # It raised the bar for the newer launch's later reports: its step 4 is now redone too.
    assert _send(collector, "launch-2", [4, 6]).reruns == 1
    c = _counters(collector)
    assert c["mfuscope_steps_total"] == 9
    assert c["mfuscope_rerun_steps_total"] == 3
    assert c["mfuscope_job_restarts_total"] == 1


def test_batches_of_a_launch_older_than_the_kept_ones_are_not_counted() -> None:
    collector = _new()
    for n in range(KEEP + 1):
        _send(collector, f"launch-{n}", [n])
    late = _send(collector, "launch-0", [100])
    assert (late.accepted, late.duplicates) == (0, 1)
    c = _counters(collector)
    assert c["mfuscope_steps_total"] == KEEP + 1
    assert c["mfuscope_job_restarts_total"] == KEEP
    # Steps reported under dropped windows still make a relaunch's steps reruns.
    assert _send(collector, "launch-new", [0]).reruns == 1


def test_a_job_remembers_a_bounded_number_of_incarnations() -> None:
    job = JobIncarnations()
    for n in range(REMEMBER + 10):
        assert job.number(f"i{n}") == n
    assert job.restarts == REMEMBER + 9
    assert job.number(f"i{REMEMBER + 9}") == REMEMBER + 9  # still known: not a restart
    assert job.restarts == REMEMBER + 9
    # The last REMEMBER are known; the one before them was forgotten (it would count anew).
    for n in range(10, REMEMBER + 10):
        assert job.number(f"i{n}") == n
    assert job.restarts == REMEMBER + 9
    assert job.number("i9") == REMEMBER + 10


def test_legacy_batches_without_an_incarnation_are_one_launch() -> None:
    collector = _new()
    legacy = batch_dict(steps=[1, 2], version="1.0")
    assert "incarnation" not in legacy
    assert collector.ingest(json.dumps(legacy).encode()).accepted == 2
    assert collector.ingest(json.dumps(legacy).encode()).duplicates == 2
    assert _counters(collector)["mfuscope_job_restarts_total"] == 0
    # An upgraded agent relaunched under the same name is a restart.
    assert SCHEMA_VERSION == "1.4"
    assert _send(collector, "new", [2, 3]).reruns == 1
    assert _counters(collector)["mfuscope_job_restarts_total"] == 1


def test_restarts_are_a_job_series_even_with_per_rank_labels() -> None:
    collector = _new(per_rank_labels=True)
    _send(collector, "a", [1, 2], rank=0)
    _send(collector, "a", [1, 2], rank=1)
    _send(collector, "b", [2], rank=0)
    _send(collector, "b", [2], rank=1)
    families = {f.name: f for f in collector.families()}
    restarts = families["mfuscope_job_restarts_total"]
    assert restarts.label_names == ("job",)
    assert [(s.labels, s.value) for s in restarts.samples] == [(JOB, 1.0)]
    reruns = families["mfuscope_rerun_steps_total"]
    assert sorted((s.labels, s.value) for s in reruns.samples) == [
        (("job-a", "0"), 1.0),
        (("job-a", "1"), 1.0),
    ]


# --- Hypothesis: interleavings of re-sends and re-runs against a simple model -------------------

# At most KEEP incarnations, so that every batch belongs to a kept one and the model needs no
# memory bound; steps far inside the idempotency window.
_batches = st.tuples(
    st.sampled_from(["a", "b", "c"][:KEEP]),
    st.integers(0, 1),
    st.lists(st.integers(0, 40), min_size=1, max_size=6, unique=True),
)
_ops = st.lists(
    st.one_of(
        _batches.map(lambda b: ("send", b)),
        st.integers(0, 1000).map(lambda i: ("resend", i)),
    ),
    min_size=1,
    max_size=30,
)


class _Model:
    """What should be counted, with unbounded memory: every counted (incarnation, rank, step),
    incarnations in order of first arrival, and a rerun when a step is at or below the highest
    step the rank reported under an earlier incarnation."""

    def __init__(self) -> None:
        self.order: list[str] = []
        self.counted: set[tuple[str, int, int]] = set()
        self.steps = self.duplicates = self.reruns = 0

    def send(self, incarnation: str, rank: int, steps: list[int]) -> None:
        if incarnation not in self.order:
            self.order.append(incarnation)
        earlier = set(self.order[: self.order.index(incarnation)])
        bar = max((s for i, r, s in self.counted if r == rank and i in earlier), default=-1)
        for step in steps:
            key = (incarnation, rank, step)
            if key in self.counted:
                self.duplicates += 1
                continue
            self.counted.add(key)
            self.steps += 1
            self.reruns += step <= bar

    @property
    def restarts(self) -> int:
        return max(len(self.order) - 1, 0)


@settings(max_examples=150, deadline=None)
@given(ops=_ops)
def test_counts_match_a_simple_model_over_any_interleaving(
    ops: list[tuple[str, Any]],
) -> None:
    collector, model = _new(), _Model()
    sent: list[tuple[str, int, list[int]]] = []
    before: dict[str, float] = {}
    for kind, arg in ops:
        if kind == "resend":
            if not sent:
                continue
            arg = sent[arg % len(sent)]
        incarnation, rank, steps = arg
        sent.append(arg)
        _send(collector, incarnation, steps, rank=rank)
        model.send(incarnation, rank, steps)
        now = _counters(collector)
        assert now["mfuscope_steps_total"] == model.steps
        assert now["mfuscope_step_seconds_total"] == model.steps * 1.0
        assert now["mfuscope_reports_duplicate_total"] == model.duplicates
        assert now["mfuscope_rerun_steps_total"] == model.reruns
        assert now["mfuscope_job_restarts_total"] == model.restarts
        assert all(now[name] >= value for name, value in before.items()), "a counter went down"
        before = now
