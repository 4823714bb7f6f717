"""Counter semantics: no exported counter ever decreases while its series exists.

PromQL's `rate`/`increase` read any decrease of a counter as a reset (and add the whole new value
as an increase), so a job total that fell when a rank expired or an agent restarted gave false
`MFUScopeReportsDropped` alerts and wrong rates. Also: the bus-bandwidth denominator counts only
the calls whose size is known.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from mfuscope.collector import Aggregator, StateConfig
from mfuscope.core.bandwidth import bus_factor

from tests.support.collector_fakes import FakeClock, batch_dict, report_dict

# (family name, labels) -> (value, start_unix_ns) of every counter sample, histogram counts too.
Counters = dict[tuple[str, tuple[str, ...]], tuple[float, int]]
_EXPIRE_AFTER_S = 30.0
_WORLD = 4
_HEALTH_FIELDS = (
    "reports_dropped_total",
    "send_failures_total",
    "profiler_failures_total",
    "windows_analysed_total",
)


def _collective(op: str, size: int | None, seconds: float) -> dict[str, Any]:
    return {
        "op": op,
        "axis": "dp",
        "tier": "inter_node",
        "group_size": _WORLD,
        "bytes": size,
        "count": 2,
        "seconds": seconds,
        "overlapped_s": 0.0,
    }


def _counters(collector: Aggregator) -> Counters:
    out: Counters = {}
    for family in collector.families():
        if family.kind == "counter":
            for s in family.samples:
                out[(family.name, s.labels)] = (s.value, s.start_unix_ns)
        for h in family.histogram_samples:
            for i, count in enumerate(h.bucket_counts):
                out[(f"{family.name}_bucket{i}", h.labels)] = (float(count), h.start_unix_ns)
            out[(f"{family.name}_sum", h.labels)] = (h.sum, h.start_unix_ns)
    return out


_batch = st.tuples(
    st.just("batch"),
    st.sampled_from(["job-a", "job-a", "job-b"]),
    st.integers(0, 2),  # rank
    st.lists(st.integers(1, 12), min_size=1, max_size=3, unique=True),  # steps (re-sends too)
    st.tuples(*[st.integers(0, 3)] * len(_HEALTH_FIELDS)),  # health increments since last batch
    st.sampled_from(["none", "sized", "unsized", "both"]),  # collectives on the first report
)
_restart = st.tuples(st.just("restart"), st.sampled_from(["job-a", "job-b"]), st.integers(0, 2))
_wait = st.tuples(st.just("wait"), st.floats(0.0, 2 * _EXPIRE_AFTER_S))
_operation = st.one_of(_batch, _batch, _restart, _wait)


def _apply(
    collector: Aggregator,
    agents: dict[tuple[str, int], list[int]],
    op: tuple[Any, ...],
) -> None:
    if op[0] == "restart":  # a new agent process for (job, rank): its counters start at 0
        agents[(op[1], op[2])] = [0] * len(_HEALTH_FIELDS)
        return
    _, job, rank, steps, increments, profiled = op
    counts = agents.setdefault((job, rank), [0] * len(_HEALTH_FIELDS))
    counts[:] = [c + i for c, i in zip(counts, increments, strict=True)]
    collectives = {
        "none": None,
        "sized": [_collective("all_reduce", 1 << 20, 0.25)],
        "unsized": [_collective("all_reduce", None, 0.25)],
        "both": [_collective("all_reduce", 1 << 20, 0.25), _collective("all_gather", None, 0.5)],
    }[profiled]
    reports = [report_dict(steps[0], collectives=collectives)]
    reports += [report_dict(step) for step in steps[1:]]
    batch = batch_dict(
        job=job,
        rank=rank,
        world_size=_WORLD,
        reports=reports,
        health=dict(zip(_HEALTH_FIELDS, counts, strict=True)),
    )
    collector.ingest(json.dumps(batch).encode())


_NO_HEALTH = (0, 0, 0, 0)
_DROPPED = (2, 0, 0, 1)


@pytest.mark.parametrize("per_rank_labels", [False, True])
@settings(max_examples=120, deadline=None)
@given(operations=st.lists(_operation, max_size=30))
# Rank 0 expires while rank 1 keeps the job alive, then comes back.
@example(
    operations=[
        ("batch", "job-a", 0, [1], _DROPPED, "sized"),
        ("wait", 20.0),
        ("batch", "job-a", 1, [1], _NO_HEALTH, "unsized"),
        ("wait", 15.0),
        ("batch", "job-a", 0, [2], _NO_HEALTH, "none"),
    ]
)
# Rank 0's agent restarts (its counters start again from zero).
@example(
    operations=[
        ("batch", "job-a", 0, [1], _DROPPED, "both"),
        ("restart", "job-a", 0),
        ("batch", "job-a", 0, [2], _NO_HEALTH, "none"),
    ]
)
def test_no_counter_ever_decreases(
    per_rank_labels: bool, operations: list[tuple[Any, ...]]
) -> None:
    """For any sequence of batches, agent restarts and rank expiries: every counter series present
    in two consecutive scrapes is non-decreasing and keeps its start time. Per job (without
    per-rank labels) no series disappears while the job has a live rank: only the whole job's."""
    clock = FakeClock()
    config = StateConfig(per_rank_labels=per_rank_labels, expire_after_s=_EXPIRE_AFTER_S)
    collector = Aggregator(config, clock=clock)
    agents: dict[tuple[str, int], list[int]] = {}
    before = _counters(collector)

    def scrape_and_check() -> None:
        nonlocal before
        after = _counters(collector)
        live_jobs = {j.job for j in collector.snapshot().jobs}
        for key, (value, start) in before.items():
            name, labels = key
            if key in after:
                new_value, new_start = after[key]
                assert new_value >= value, (key, value, new_value)
                assert new_start == start, key
            elif not per_rank_labels and name != "mfuscope_reports_rejected_total":
                assert labels[0] not in live_jobs, f"{key} vanished while its job lives"
        before = after

    for op in operations:
        if op[0] == "wait":
            clock.advance(op[1])
        else:
            clock.advance(0.5)  # distinct start times for series that (re)appear
            scrape_and_check()  # (expiries happen here, not inside the batch's own step)
            _apply(collector, agents, op)
        scrape_and_check()


def test_agent_health_counts_survive_rank_expiry_and_restart() -> None:
    """The defect the property test guards against, in one example: on the old code the job's
    dropped-reports counter fell from 7 to 2 when rank 0 expired and from 2 to 1 when rank 1's
    agent restarted."""
    clock = FakeClock()
    collector = Aggregator(StateConfig(expire_after_s=10), clock=clock)
    key = ("mfuscope_reports_dropped_total", ("job-a",))

    def send(rank: int, step: int, dropped: int) -> None:
        batch = batch_dict(rank=rank, steps=[step], health={"reports_dropped_total": dropped})
        collector.ingest(json.dumps(batch).encode())

    send(0, 1, 5)
    clock.advance(6)
    send(1, 1, 2)
    assert _counters(collector)[key][0] == 7
    clock.advance(6)  # rank 0 expires
    assert _counters(collector)[key][0] == 7
    send(1, 2, 1)  # rank 1's agent restarted and has dropped 1 report since
    assert _counters(collector)[key][0] == 8


def test_unsized_calls_do_not_understate_busbw_from_counters() -> None:
    """A profiled step with 2 sized all_reduce calls (1 MiB each, 0.25 s) and 2 of unknown size
    (0.75 s): busbw over the sized calls is 2 MiB × bus factor / 0.25 s; dividing by all 1 s of
    collective time, as the rules did, read 4× too low."""
    collector = Aggregator(StateConfig(), clock=FakeClock())
    sized = _collective("all_reduce", 1 << 20, 0.25)
    unsized = _collective("all_reduce", None, 0.75)
    batch = batch_dict(world_size=_WORLD, reports=[report_dict(1, collectives=[sized, unsized])])
    collector.ingest(json.dumps(batch).encode())
    c = _counters(collector)
    labels = ("job-a", "all_reduce", "dp", "inter_node")
    bus_bytes = c[("mfuscope_collective_bus_bytes_total", labels)][0]
    seconds = c[("mfuscope_collective_seconds_total", labels)][0]
    sized_seconds = c[("mfuscope_collective_sized_seconds_total", labels)][0]
    assert (seconds, sized_seconds) == (1.0, 0.25)
    true_busbw = 2 * (1 << 20) * bus_factor("all_reduce", _WORLD) / 0.25
    assert bus_bytes / sized_seconds == pytest.approx(true_busbw)
    assert bus_bytes / seconds == pytest.approx(true_busbw / 4)  # the old, understated reading
    # The latest-window gauge already used the sized calls only: both now agree.
    gauge = collector.snapshot().jobs[0].latest.tier_busbw[0][2]
    assert gauge == pytest.approx(true_busbw)
