"""validate-gpu's flight-recorder probe (`_flight`, `_flight_report`) without a GPU: its parts
with NCCL dumps faked at the recorder boundary (`tests/support/fr_dumps.py`) read by the agent's
own `CollectiveReader`, its checks, the clean skip, and its rank workload for real on a one-rank
gloo group on CPU (the native dump of the generic recorder against the binding, calls and bytes
per op; no durations or device stall on gloo)."""

from __future__ import annotations

import dataclasses
import json
import logging
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
from mfuscope.agent import RateLimitedLog
from mfuscope.agent.collective_reader import CollectiveReader
from mfuscope.agent.flight_recorder import DumpSource
from mfuscope.cli.validate_gpu import _flight
from mfuscope.cli.validate_gpu._flight_report import (
    DumpComparison,
    FlightProbe,
    OpTraffic,
    StallProbe,
    flight_checks,
)
from mfuscope.core.hangs import BLOCKED_AFTER_S

from tests.support.fr_dumps import nccl_dump, nccl_entry

NOW_NS = 1_763_700_100_000_000_000
LONG_AGO_NS = NOW_NS - int((BLOCKED_AFTER_S + 0.5) * 1e9)
ROOT = Path(__file__).resolve().parents[3]


def _reader(dumps: list[dict[str, Any]], world: int = 2) -> CollectiveReader:
    """The agent's reader over one faked NCCL recorder that returns `dumps` in turn."""
    it = iter(dumps)
    source = DumpSource("nccl", lambda: next(it), json=False, native=False)
    log = RateLimitedLog(60.0, logger=logging.getLogger("test"))
    return CollectiveReader(
        [source], _flight._names(world), log=log, durations=True, wall_clock_ns=lambda: NOW_NS
    )


def _progress(entries: list[dict[str, Any]]) -> tuple[Any, ...]:
    reader = _reader([nccl_dump([]), nccl_dump(entries)])
    reader.baseline()
    reader.read_once()
    return reader.records().groups


def _done(record_id: int, seq: int, **kw: Any) -> dict[str, Any]:
    return nccl_entry(record_id, seq, created_ns=LONG_AGO_NS - 10**9, **kw)


def test_a_peer_that_never_joined_is_named() -> None:
    # rank 0 entered all_reduce 4 and waits in it; rank 1 stopped after 3 (the probe's peer stall)
    waiting = [*(_done(i - 1, i) for i in range(1, 4))]
    waiting.append(nccl_entry(3, 4, created_ns=LONG_AGO_NS, completed=False))
    stalled = [_done(i - 1, i) for i in range(1, 4)]
    probe = _flight.join_stall("peer", 1, 4, [(0, _progress(waiting)), (1, _progress(stalled))])
    assert probe.suspects == (1,) and probe.suspect_seqs == (4,)
    assert probe.blocked_ops == ("all_reduce",)
    assert probe.waited_s == pytest.approx(BLOCKED_AFTER_S + 0.5)
    assert flight_checks(_healthy(stall=probe), {})[3].ok


def test_one_busy_rank_is_found_blocked_with_no_one_to_blame() -> None:
    entries = [_done(0, 1), nccl_entry(1, 2, created_ns=LONG_AGO_NS, completed=False)]
    probe = _flight.join_stall("device", 0, 2, [(0, _progress(entries))])
    assert probe.suspects == () and probe.blocked_ops == ("all_reduce",)
    assert flight_checks(_healthy(stall=probe), {})[3].ok
    # a wait shorter than the threshold is an ordinary collective in flight: nothing is found
    young = [_done(0, 1), nccl_entry(1, 2, created_ns=NOW_NS - 10**9, completed=False)]
    short = _flight.join_stall("device", 0, 2, [(0, _progress(young))])
    assert short.blocked_ops == () and not flight_checks(_healthy(stall=short), {})[3].ok


def test_traffic_per_op_is_the_agents_count_against_what_was_issued() -> None:
    entries = [_done(i - 1, i, duration_ms=0.25) for i in range(1, 4)]
    gather = {"name": "nccl:_allgather_base", "shape": (8,), "out_shape": (16,)}
    entries.append(_done(3, 4, duration_ms=0.1, **gather))
    reader = _reader([nccl_dump([]), nccl_dump(entries)])
    reader.baseline()
    reader.read_once()
    issued = {"all_reduce": (3, 3 * 48), "all_gather": (1, 64), "broadcast": (2, 96)}
    traffic = _flight.traffic_against(reader.records().traffic, issued)
    assert traffic == (
        OpTraffic("all_gather", 1, 64, pytest.approx(1e-4), 1, 64),
        OpTraffic("all_reduce", 3, 3 * 48, pytest.approx(7.5e-4), 3, 3 * 48),
        OpTraffic("broadcast", 0, 0, 0.0, 2, 96),
    )
    check = flight_checks(_healthy(traffic=traffic), {})[2]
    assert not check.ok and "broadcast 0/2 calls 0/96 B" in check.measured


def test_dumps_compared_to_the_first_difference() -> None:
    dump = {"version": "2.10", "entries": [nccl_entry(1, 1), nccl_entry(2, 2)]}
    blob = json.dumps(dump)
    same = _flight.compare_dumps("nccl", blob.encode(), blob)
    assert same == DumpComparison("nccl", 2, True, "")
    other = json.loads(blob)
    other["entries"][1]["duration_ms"] = 0.5
    differs = _flight.compare_dumps("nccl", blob.encode(), json.dumps(other))
    assert not differs.equal
    assert differs.difference == "$.entries[1].duration_ms: 0.036 vs 0.5"
    other["entries"].pop()
    assert _flight.compare_dumps("nccl", blob.encode(), json.dumps(other)).difference == (
        "$.entries: 2 vs 1 items"
    )


def _healthy(**change: Any) -> FlightProbe:
    probe = FlightProbe(
        world_size=2,
        native=True,
        dumps=(DumpComparison("generic", 0, True), DumpComparison("nccl", 18, True)),
        timed=15,
        done=15,
        all_reduce_event_s=0.0019,
        traffic=(OpTraffic("all_reduce", 5, 5 << 20, 0.0018, 5, 5 << 20),),
        stall=StallProbe("peer", 1, 7, (1,), (7,), ("all_reduce",), 10.5),
    )
    return dataclasses.replace(probe, **change)


@pytest.mark.parametrize(
    ("change", "failing"),
    [
        ({"native": False, "dumps": ()}, 0),  # the agent fell back to the pickle binding
        ({"dumps": (DumpComparison("nccl", 18, False, "$.entries[3].state"),)}, 0),
        ({"dumps": (DumpComparison("nccl", 0, True),)}, 0),  # nothing compared
        ({"timed": 14}, 1),  # one done entry without a duration
        # the durations against the events around each call: 10% either way at most
        ({"all_reduce_event_s": 0.0016}, 1),  # durations 12.5% longer
        ({"all_reduce_event_s": 0.0021}, 1),  # 14% shorter
        ({"all_reduce_event_s": 0.0}, 1),  # no event time
        ({"traffic": (OpTraffic("all_reduce", 5, 5 << 20, 0.0, 5, 5 << 20),)}, 1),
        ({"traffic": (OpTraffic("all_reduce", 4, 4 << 20, 0.0018, 5, 5 << 20),)}, 2),
        ({"stall": StallProbe("peer", 1, 7, (0, 1), (7, 7), ("all_reduce",), 10.5)}, 3),
        ({"stall": StallProbe("peer", 1, 7, (1,), (6,), ("all_reduce",), 10.5)}, 3),
        ({"stall": None}, 3),
    ],
)
def test_each_flight_check_can_fail(change: dict[str, Any], failing: int) -> None:
    assert all(c.ok for c in flight_checks(_healthy(), {}))
    checks = flight_checks(_healthy(**change), {})
    assert [i for i, c in enumerate(checks) if not c.ok] == [failing]


def test_without_cuda_the_probe_skips_with_its_reason(tmp_path: Path) -> None:
    assert _flight.skip_reason() == "no CUDA device"  # this machine has no GPU
    probe = _flight.flight_probe(tmp_path, gpus=0)
    assert probe.skipped == "skipped: no CUDA device"
    checks = flight_checks(probe, {})
    assert len(checks) == 4 and {c.measured for c in checks} == {"skipped: no CUDA device"}
    assert not any(c.ok for c in checks)


@pytest.mark.slow
def test_the_rank_workload_on_a_one_rank_gloo_group(tmp_path: Path) -> None:
    """The workload as a GPU rank runs it, on gloo and CPU in a process of its own."""
    code = textwrap.dedent(
        f"""
        import mfuscope.agent
        import torch.distributed as dist
        from pathlib import Path
        from mfuscope.cli.validate_gpu import _flight
        # An in-process store: a port picked, freed and bound again can be taken in between.
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
        _flight.rank_workload(0, 1, device="cpu", stall_s=0, out_dir=Path({str(tmp_path)!r}))
        dist.destroy_process_group()
        """
    )
    subprocess.run(
        [sys.executable, "-W", "ignore::FutureWarning", "-c", code],
        cwd=ROOT,
        check=True,
        timeout=120,
    )
    result = json.loads((tmp_path / "flight-rank0.json").read_text())
    probe = _flight.probe_from_results(1, [result])
    # torch's own JSON binding and the agent's native dump of the generic (gloo) recorder
    assert probe.native and [d.source for d in probe.dumps] == ["generic"]
    assert probe.dumps[0].equal and probe.dumps[0].entries >= 3 * _flight.CALLS
    size = 4 << 18  # float32 x 2^18
    assert probe.traffic == (
        OpTraffic("all_gather", _flight.CALLS, _flight.CALLS * size, 0.0, _flight.CALLS,
                  _flight.CALLS * size),
        OpTraffic("all_reduce", _flight.CALLS, _flight.CALLS * size, 0.0, _flight.CALLS,
                  _flight.CALLS * size),
        OpTraffic("broadcast", _flight.CALLS, _flight.CALLS * size, 0.0, _flight.CALLS,
                  _flight.CALLS * size),
    )  # fmt: skip
    assert probe.done == 3 * _flight.CALLS and probe.timed == 0  # gloo times nothing
    checks = flight_checks(probe, {})
    assert [c.ok for c in checks] == [True, False, True, False]  # no durations, no stall here


def test_the_ranks_results_go_through_json_into_the_probe() -> None:
    """What each rank writes (`rank_workload`'s JSON) and the parent reads back, stall included."""
    import msgspec

    waiting = [_done(0, 1), nccl_entry(1, 2, created_ns=LONG_AGO_NS, completed=False)]
    ranks = {0: _progress(waiting), 1: _progress([_done(0, 1)])}
    traffic = _flight.traffic_against((), {"all_reduce": (5, 80)})
    results = [
        json.loads(
            json.dumps(
                {
                    "rank": rank,
                    "native": True,
                    "dumps": [msgspec.to_builtins(DumpComparison("nccl", 9, True))],
                    "done": 15,
                    "timed": 15,
                    "all_reduce_event_s": 0.002,
                    "traffic": [msgspec.to_builtins(t) for t in traffic],
                    "stall": {"groups": [msgspec.to_builtins(g) for g in groups]},
                }
            )
        )
        for rank, groups in ranks.items()
    ]
    probe = _flight.probe_from_results(2, results)
    assert probe.stall == StallProbe(
        "peer", 1, 2, (1,), (2,), ("all_reduce",), pytest.approx(BLOCKED_AFTER_S + 0.5)
    )
    assert probe.dumps == (DumpComparison("nccl", 9, True),)
    assert probe.traffic == (OpTraffic("all_reduce", 0, 0, 0.0, 5, 80),)
