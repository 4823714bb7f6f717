"""The /v1/summary digest for live views."""

from __future__ import annotations

import json
from typing import Any

import pytest
from mfuscope.collector import Aggregator, StateConfig
from mfuscope.collector._summary import summary

from tests.support.collector_fakes import FakeClock, batch_dict, report_dict


def _collective(op: str, seconds: float) -> dict[str, Any]:
    return {
        "op": op,
        "axis": "dp",
        "tier": "inter_node",
        "group_size": 2,
        "bytes": 1000,
        "count": 1,
        "seconds": seconds,
        "overlapped_s": 0.0,
    }


def test_summary_of_a_known_job() -> None:
    clock = FakeClock()
    collector = Aggregator(StateConfig(window_steps=5), clock=clock)
    collectives = [_collective(op, s) for op, s in (("all_reduce", 0.5), ("broadcast", 0.25))]
    topology = {
        "groups": [
            {"axis": "dp", "tier": "inter_node", "size": 2, "spans_hosts": True,
             "link_peak_bytes_per_s": 8000.0, "link_peak_source": "sysfs"},
            {"axis": "tp", "tier": "intra_node", "size": 2, "spans_hosts": True},
        ]
    }  # fmt: skip
    first = batch_dict(
        rank=0,
        reports=[report_dict(1, collectives=collectives)],
        topology=topology,
        health={"reports_dropped_total": 4},
    )
    collector.ingest(json.dumps(first).encode())
    collector.ingest(json.dumps(first).encode())
    second = batch_dict(rank=1, reports=[report_dict(1, compute_fraction=0.25, exposed=None)])
    collector.ingest(json.dumps(second).encode())
    clock.advance(2)
    doc = summary(collector.snapshot(), top_collectives=1)
    json.dumps(doc, allow_nan=False)  # strict JSON
    (job,) = doc["jobs"]
    assert doc["rejected"] == {
        "content_type": 0,
        "invalid": 0,
        "rate_limited": 0,
        "too_large": 0,
        "too_many_axes": 0,
        "too_many_jobs": 0,
        "too_many_ranks": 0,
        "unauthorized": 0,
        "version": 0,
    }
    assert (job["job"], job["ranks"], job["world_size"], job["steps_total"]) == ("job-a", 2, 2, 2)
    assert job["mfu"] == pytest.approx(0.4) and job["hfu"] == pytest.approx(0.5)
    assert job["window_steps"] == 5
    assert job["components"] == {
        "compute": pytest.approx(0.5),
        "exposed_comm": pytest.approx(0.125),
        "bubble_idle": pytest.approx(0.375),
    }
    assert job["exposed_comm"] == [
        {"axis": "dp", "tier": "intra_node", "fraction": pytest.approx(0.125)}
    ]
    assert job["collectives"] == [  # the top one by time only
        {
            "op": "all_reduce",
            "axis": "dp",
            "tier": "inter_node",
            "calls": 1,
            "bytes": 1000.0,
            "seconds": 0.5,
            "busbw_bytes_per_s": 2000.0,
            "efficiency": 0.25,
        }
    ]
    assert job["tiers"] == [
        {
            "axis": "dp",
            "tier": "inter_node",
            "busbw_bytes_per_s": pytest.approx(2000 / 0.75),
            "peak_bytes_per_s": 8000.0,
            "peak_sources": ["sysfs"],
            "efficiency": pytest.approx(2000 / 0.75 / 8000),
        }
    ]
    # Rank 0 waits 0.25 s of its 1 s step, rank 1 none: rank 1 is the straggler.
    assert job["straggler_basis"] == "self"
    assert job["stragglers"] == [
        {
            "rank": 1,
            "host": "node-0",
            "node": "node-0",  # the agents sent no node: their host
            "ratio": pytest.approx(1 / 0.875),
            "step_s": 1.0,
        }
    ]
    assert job["tp_spans_hosts"] is True
    assert job["last_report_age_s"] == 2.0
    assert job["reports"] == {
        "accepted": 2,
        "duplicates": 1,
        "reruns": 0,
        "dropped_by_agents": 4,
    }
    assert job["restarts"] == 0
    assert job["agent_health"]["reports_dropped_total"] == 4


def test_empty_collector() -> None:
    doc = summary(Aggregator(clock=FakeClock()).snapshot())
    assert doc["jobs"] == [] and doc["version"] == 1 and doc["expire_after_s"] == 300.0
