"""Incremental job sums: equal to sums rebuilt from scratch after any sequence of batches and
expiries, and a key leaves with its last contributor."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from mfuscope.collector import Aggregator, StateConfig
from mfuscope.collector._sums import CountedSums

from tests.support.collector_fakes import FakeClock, batch_dict, report_dict


def test_keys_leave_with_their_last_contributor() -> None:
    sums = CountedSums()
    a = ((("x",), (0.1,)), (("y",), (1.0, 2.0)))
    b = ((("x",), (0.2,)),)
    sums.replace((), a)
    sums.replace((), b)
    assert sums.counts == {("x",): 2, ("y",): 1}
    assert sums.sums[("x",)] == (pytest.approx(0.3),)
    sums.replace(a, ())
    assert sums.sums == {("x",): (pytest.approx(0.2),)}
    sums.replace(b, ())
    assert (sums.sums, sums.counts) == ({}, {})  # no float residue left behind


_COLLECTIVE = {
    "op": "all_gather",
    "axis": "tp",
    "tier": "intra_node",
    "group_size": 4,
    "bytes": 4096,
    "count": 3,
    "seconds": 0.3,
    "overlapped_s": 0.1,
}
_operation = st.one_of(
    st.tuples(
        st.just("batch"),
        st.integers(0, 4),  # rank
        st.lists(st.integers(1, 30), min_size=1, max_size=4, unique=True),  # steps
        st.floats(0.01, 10.0),  # wall
        st.floats(0.0, 1.0),  # compute fraction
        st.booleans(),  # peak known
        st.booleans(),  # profiled (collectives)
        st.integers(0, 50),  # reports dropped
    ),
    st.tuples(st.just("wait"), st.floats(0.0, 40.0)),
)


@settings(max_examples=60, deadline=None)
@given(operations=st.lists(_operation, max_size=25))
def test_incremental_sums_equal_a_rebuild(operations: list[tuple[Any, ...]]) -> None:
    clock = FakeClock()
    collector = Aggregator(StateConfig(expire_after_s=60, window_steps=3), clock=clock)
    for op in operations:
        if op[0] == "wait":
            clock.advance(float(op[1]))
            collector.snapshot()  # expires silent ranks
            continue
        _, rank, steps, wall, compute, peak_known, profiled, dropped = op
        reports = [
            report_dict(
                step,
                wall_s=wall,
                compute_fraction=compute,
                collectives=[_COLLECTIVE] if profiled else None,
            )
            for step in steps
        ]
        batch = batch_dict(
            rank=rank,
            world_size=5,
            reports=reports,
            peak_flops=1e12 if peak_known else None,
            health={"reports_dropped_total": dropped},
        )
        collector.ingest(json.dumps(batch).encode())
    for job in collector._state.jobs.values():
        rebuilt = CountedSums()
        rebuilt.rebuild(r.contribution for r in job.ranks.values())
        assert job.sums.counts == rebuilt.counts
        assert job.sums.sums.keys() == rebuilt.sums.keys()
        for key, values in rebuilt.sums.items():
            assert job.sums.sums[key] == pytest.approx(values, rel=1e-9, abs=1e-9), key
