"""mfuscope_breakdown_age_seconds: how old the newest profiled window of a job's live ranks is."""

from __future__ import annotations

import json
from typing import Any

import pytest
from mfuscope.collector import Aggregator, StateConfig

from tests.support.collector_fakes import FakeClock, batch_dict, report_dict

AGE = "mfuscope_breakdown_age_seconds"
COLLECTIVE = {
    "op": "all_reduce",
    "axis": "dp",
    "tier": "inter_node",
    "group_size": 2,
    "bytes": 1000,
    "count": 1,
    "seconds": 0.25,
    "overlapped_s": 0.0,
}


def _ages(collector: Aggregator) -> dict[tuple[str, ...], float]:
    (family,) = [f for f in collector.families() if f.name == AGE]
    assert family.kind == "gauge" and family.label_names == ("job",)
    return {s.labels: s.value for s in family.samples}


def _send(collector: Aggregator, rank: int, *reports: dict[str, Any], job: str = "job-a") -> None:
    collector.ingest(json.dumps(batch_dict(job=job, rank=rank, reports=list(reports))).encode())


def _step(step: int, window: int | None) -> dict[str, Any]:
    """A step report carrying the breakdown of the window at step `window` (None: none)."""
    report = report_dict(step)
    if window is None:
        report["components"] = []
    else:
        report["breakdown_step"] = window
    return report


@pytest.mark.parametrize("per_rank_labels", [False, True])
def test_age_of_the_newest_window_any_live_rank_reported(per_rank_labels: bool) -> None:
    clock = FakeClock()
    collector = Aggregator(
        StateConfig(expire_after_s=100, per_rank_labels=per_rank_labels), clock=clock
    )
    _send(collector, 0, _step(1, None), _step(2, None))
    _send(collector, 1, _step(1, None))
    assert _ages(collector) == {}  # no window yet: no age, not 0
    _send(collector, 0, _step(10, 10), _step(11, 11))  # a profiled window
    clock.advance(40)
    # Later steps carry that window's breakdown; they are not windows themselves.
    _send(collector, 0, _step(12, 11), _step(13, 11))
    assert _ages(collector) == {("job-a",): 40.0}
    clock.advance(20)
    _send(collector, 1, _step(10, 10))  # rank 1's report of the same window, arriving later
    clock.advance(5)
    assert _ages(collector) == {("job-a",): 5.0}
    # A re-sent report of the window is a duplicate, not a new window.
    _send(collector, 1, _step(10, 10))
    clock.advance(30)
    assert _ages(collector) == {("job-a",): 35.0}
    # Rank 1 falls silent and expires: the newest window of the live ranks is rank 0's.
    for step in (14, 15, 16):
        clock.advance(40)
        _send(collector, 0, _step(step, 11))
    assert _ages(collector) == {("job-a",): 215.0}


def test_a_step_with_collectives_is_a_window_and_jobs_are_apart() -> None:
    clock = FakeClock()
    collector = Aggregator(StateConfig(), clock=clock)
    profiled = report_dict(3, collectives=[COLLECTIVE])  # no breakdown_step (an older agent)
    _send(collector, 0, profiled, job="job-a")
    clock.advance(7)
    _send(collector, 0, report_dict(4), job="job-b")
    assert _ages(collector) == {("job-a",): 7.0}


SPREAD = "mfuscope_breakdown_spread_ratio"


def _spreads(collector: Aggregator) -> dict[tuple[str, ...], float]:
    (family,) = [f for f in collector.families() if f.name == SPREAD]
    assert family.kind == "gauge" and family.label_names == ("job",)
    return {s.labels: s.value for s in family.samples}


def _window_step(step: int, exposed: float) -> dict[str, Any]:
    """A profiled step (its own breakdown) with `exposed` of its 1 s exposed."""
    report = report_dict(step, compute_fraction=1 - exposed)
    report["breakdown_step"] = step
    return report


def test_spread_of_exposed_comm_between_the_latest_windows_of_the_rank_where_it_is_largest() -> (
    None
):
    collector = Aggregator(StateConfig(), clock=FakeClock())
    # Window 1 (steps 10-12): its first step (the profiler's start) is left out, as the steps
    # after it carry it: 0.2. One window: no spread yet.
    _send(collector, 0, _window_step(10, 0.9), _window_step(11, 0.2), _window_step(12, 0.2))
    _send(collector, 0, _step(13, 12))
    assert _spreads(collector) == {}
    _send(collector, 0, _window_step(70, 0.9), _window_step(71, 0.3), _window_step(72, 0.5))
    _send(collector, 1, _window_step(10, 0.1), _window_step(11, 0.1))
    _send(collector, 1, _window_step(70, 0.1), _window_step(71, 0.15))
    # rank 0: 0.2 and 0.4; rank 1: 0.1 and 0.15; the job shows the larger
    assert _spreads(collector) == {("job-a",): pytest.approx(0.2)}
    for n in range(5):  # only the latest 5 windows count: the 0.2 and 0.4 ones age out
        first = 100 + 10 * n
        _send(collector, 0, _window_step(first, 0.9), _window_step(first + 1, 0.25))
    assert _spreads(collector) == {("job-a",): pytest.approx(0.05)}
