"""The collector's job-time ledger: `mfuscope_job_rank_seconds_total{job, category}` from the
agents' totals, the step reports, a hang and a restart, summing exactly to the ranks' spans;
effective MFU beside it (the counters and /v1/summary)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from mfuscope.collector import Aggregator, StateConfig
from mfuscope.collector._summary import summary
from mfuscope.core.ledger import CATEGORIES

from tests.support.collector_fakes import FakeClock, batch_dict, report_dict

S = 1_000_000_000
START = 1_763_700_000_000_000_000
PEAK = 1e12


def _ledger(start: int, **seconds: float) -> dict[str, Any]:
    return {"process_start_unix_ns": start, **{f"{k}_ns": round(v * S) for k, v in seconds.items()}}


def _progress(waited_s: float | None, seq: int = 11) -> dict[str, Any]:
    group: dict[str, Any] = {
        "group": "0",
        "axis": "dp",
        "tier": "intra_node",
        "size": 2,
        "entered_seq": seq,
        "completed_seq": seq - 1 if waited_s is not None else seq,
    }
    if waited_s is not None:
        group["pending"] = {"seq": seq, "op": "all_reduce", "waited_s": waited_s}
    return {"source": "flight_recorder", "status_interval_s": 10.0, "groups": [group]}


def _send(
    collector: Aggregator,
    steps: list[int],
    ledger: dict[str, Any],
    *,
    rank: int = 0,
    launch: str = "one",
    wall_s: float = 1.0,
    waited_s: float | None = None,
) -> None:
    body = batch_dict(
        rank=rank,
        reports=[report_dict(s, wall_s=wall_s) for s in steps],
        incarnation=launch,
        ledger=ledger,
        peak_flops=PEAK,
        comm=_progress(waited_s),
    )
    collector.ingest(json.dumps(body).encode())


def _time(collector: Aggregator, per_rank: bool = False) -> dict[tuple[str, ...], float]:
    (family,) = [f for f in collector.families() if f.name == "mfuscope_job_rank_seconds_total"]
    assert family.label_names == (("job", "rank") if per_rank else ("job",)) + ("category",)
    return {s.labels[1:]: s.value for s in family.samples}


def _counter(collector: Aggregator, name: str) -> float:
    (family,) = [f for f in collector.families() if f.name == name]
    (sample,) = family.samples
    return sample.value


def test_every_category_is_exported_from_zero() -> None:
    collector = Aggregator(StateConfig(), clock=FakeClock())
    collector.ingest(json.dumps(batch_dict()).encode())  # an agent before the ledger
    assert _time(collector) == {(c,): 0.0 for c in CATEGORIES}


def test_a_crashed_hung_and_relaunched_job_sums_to_its_ranks_spans() -> None:
    collector = Aggregator(StateConfig(), clock=FakeClock())
    for rank in (0, 1):  # launch one: 3 s startup, 10 steps of 1 s, a 2 s checkpoint save
        _send(collector, list(range(10)), _ledger(START, startup=3, checkpoint_save=2), rank=rank)
    # rank 1 stops in step 10; rank 0 waits in its all_reduce, 25 s: 15 s hung, then both die
    _send(collector, [], _ledger(START, startup=3, checkpoint_save=2), waited_s=25.0)
    # launch two, 40 s after the first process started: both resume from step 6
    relaunch = START + 40 * S
    for rank in (0, 1):
        _send(
            collector,
            list(range(6, 12)),
            _ledger(relaunch, startup=4, shutdown=0.5),
            rank=rank,
            launch="two",
        )
    time = _time(collector)
    assert time[("startup",)] == 2 * (3 + 4)
    assert time[("step",)] == 2 * 10 + 2 * 2  # steps 0-9, then 10 and 11
    assert time[("redone_step",)] == 2 * 4  # steps 6-9 again
    assert time[("checkpoint_save",)] == 2 * 2
    assert time[("hung",)] == 15
    assert time[("shutdown",)] == 2 * 0.5
    # down: rank 0 accounted for 3 + 10 + 2 + 15 = 30 s, rank 1 for 15 s of the 40 s
    assert time[("down",)] == (40 - 30) + (40 - 15)
    spans = 2 * (40 + 4 + 6 + 0.5)  # each rank: first start to the end of its last process
    assert sum(time.values()) == pytest.approx(spans, abs=1e-9)
    useful = 2 * 12 * 4e11  # steps 0-11 once each, 4e11 FLOPs each (`report_dict`)
    assert _counter(collector, "mfuscope_useful_model_flops_total") == useful
    assert _counter(collector, "mfuscope_job_peak_flop_seconds_total") == pytest.approx(
        PEAK * spans
    )
    job = summary(collector.snapshot())["jobs"][0]
    assert job["effective_mfu"] == pytest.approx(useful / (PEAK * spans))
    assert job["job_time_s"]["down"] == time[("down",)]


def test_the_hung_seconds_come_out_of_the_step_that_was_hung() -> None:
    collector = Aggregator(StateConfig(), clock=FakeClock())
    _send(collector, [0], _ledger(START, startup=1))
    _send(collector, [], _ledger(START, startup=1), waited_s=30.0)  # 20 s hung so far
    _send(collector, [1], _ledger(START, startup=1), wall_s=31.0)  # it moved on: a 31 s step
    time = _time(collector)
    assert (time[("hung",)], time[("step",)]) == (20.0, 1.0 + 11.0)
    assert sum(time.values()) == 1 + 1 + 31


def test_per_rank_labels_split_the_ledger_by_rank() -> None:
    collector = Aggregator(StateConfig(per_rank_labels=True), clock=FakeClock())
    _send(collector, [0, 1], _ledger(START, startup=2), rank=0)
    _send(collector, [0], _ledger(START, startup=5), rank=1)
    time = _time(collector, per_rank=True)
    assert time[("0", "startup")] == 2 and time[("1", "startup")] == 5
    assert time[("0", "step")] == 2 and time[("1", "step")] == 1


def test_a_resent_batch_books_nothing_twice() -> None:
    collector = Aggregator(StateConfig(), clock=FakeClock())
    for _ in range(3):
        _send(collector, [0, 1, 2], _ledger(START, startup=2, evaluation=1))
    assert sum(_time(collector).values()) == 2 + 1 + 3
