"""The wire form of the always-on collective records (schema 1.2): round trip and validation."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from mfuscope.core import schema as s
from mfuscope.core.collective_records import (
    ArrivalSample,
    CollectiveTraffic,
    CommRecords,
    GroupProgress,
    PendingCollective,
)
from mfuscope.core.errors import SchemaError

from tests.support.collector_fakes import batch_dict
from tests.support.wire import decode_value

COMM: dict[str, Any] = {
    "source": "flight_recorder",
    "durations": True,
    "status_interval_s": 10.0,
    "lost_total": 3,
    "traffic": [
        {
            "op": "all_reduce",
            "axis": "dp",
            "tier": "inter_node",
            "group_size": 16,
            "calls": 4812,
            "bytes": 504658329600,
            "seconds": 12.5,
            "sized_seconds": 12.0,
            "sized_bytes": 500000000000,
        }
    ],
    "groups": [
        {
            "group": "3",
            "axis": "dp",
            "tier": "inter_node",
            "size": 16,
            "entered_seq": 4812,
            "completed_seq": 4811,
            "pending": {"seq": 4812, "op": "all_reduce", "bytes": 104857600, "waited_s": 94.2},
        }
    ],
    "arrivals": [{"group": "3", "seq": 4790, "enqueued_unix_ns": 1763700000000000000}],
}


def test_comm_round_trips_and_closing_defaults_to_false() -> None:
    batch = decode_value(batch_dict(comm=COMM, closing=True, reports=[]))
    assert batch.closing and batch.reports == ()
    assert batch.comm == CommRecords(
        source="flight_recorder",
        durations=True,
        status_interval_s=10.0,
        lost_total=3,
        traffic=(
            CollectiveTraffic(
                op="all_reduce",
                axis="dp",
                tier="inter_node",
                group_size=16,
                calls=4812,
                bytes=504658329600,
                seconds=12.5,
                sized_seconds=12.0,
                sized_bytes=500000000000,
            ),
        ),
        groups=(
            GroupProgress(
                group="3",
                axis="dp",
                tier="inter_node",
                size=16,
                entered_seq=4812,
                completed_seq=4811,
                pending=PendingCollective(
                    seq=4812, op="all_reduce", bytes=104857600, waited_s=94.2
                ),
            ),
        ),
        arrivals=(ArrivalSample("3", 4790, 1763700000000000000),),
    )
    assert s.decode_batch(s.encode_batch(batch)) == batch
    older = decode_value(batch_dict())  # a 1.1 agent's batch: no records, not closing
    assert older.comm is None and not older.closing


def _broken(path: list[Any], value: Any) -> dict[str, Any]:
    comm = copy.deepcopy(COMM)
    target: Any = comm
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    return comm


@pytest.mark.parametrize(
    ("path", "value", "field"),
    [
        (["source"], "nvml", "comm.source"),
        (["traffic", 0, "op"], "barrier", "comm.traffic[0].op"),
        (["traffic", 0, "calls"], -1, "comm.traffic[0].calls"),
        (["traffic", 0, "sized_seconds"], 13.0, "comm.traffic[0].sized_seconds"),
        (["groups", 0, "pending", "seq"], 4813, "comm.groups[0].pending.seq"),
        (["groups", 0, "completed_seq"], 4813, "comm.groups[0].completed_seq"),
        (["groups", 0, "pending", "op"], "frobnicate", "comm.groups[0].pending.op"),
        (["groups", 0, "pending", "waited_s"], float("nan"), "comm.groups[0].pending.waited_s"),
        (["status_interval_s"], 0.0, "comm.status_interval_s"),
        (["durations"], "yes", "comm.durations"),
    ],
)
def test_bad_records_name_the_field(path: list[Any], value: Any, field: str) -> None:
    with pytest.raises(SchemaError) as info:
        decode_value(batch_dict(comm=_broken(path, value)))
    assert info.value.field == field


def test_a_group_twice_is_refused() -> None:
    comm = copy.deepcopy(COMM)
    comm["groups"].append(copy.deepcopy(comm["groups"][0]))
    with pytest.raises(SchemaError, match="twice"):
        decode_value(batch_dict(comm=comm))
    with pytest.raises(SchemaError) as info:
        decode_value(batch_dict(closing="yes"))
    assert info.value.field == "closing"
