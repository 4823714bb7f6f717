"""The agent's flight-recorder reader: partial JSON decoding, incremental reads from fake
recorders (real gloo dumps, NCCL-shaped ones), the last read at close, turning the recorder on,
and the GIL-free native dump against the binding in a real process."""

from __future__ import annotations

import json
import logging
import os
import platform
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from mfuscope.agent._fr_json import entries_from
from mfuscope.agent._health import RateLimitedLog
from mfuscope.agent._periodic import Periodic
from mfuscope.agent.collective_reader import CollectiveReader
from mfuscope.agent.flight_recorder import (
    DumpSource,
    enable_flight_recorder,
    enable_nccl_timing,
    nccl_group_count,
    ring_entries,
)
from mfuscope.core.flight_accounting import GroupName

from tests.support.fr_dumps import gloo_dump, nccl_dump, nccl_entry

ROOT = Path(__file__).resolve().parents[3]


def _json_dump(entries: list[dict[str, Any]]) -> bytes:
    """Compact JSON, as ``nlohmann::json::dump()`` writes the recorder's JSON dump."""
    body = {"comm_lib_version": "", "entries": entries, "version": "2.10"}
    return json.dumps(body, separators=(",", ":")).encode()


@pytest.mark.parametrize("chunk", [1, 3, 128])
def test_entries_from_decodes_only_what_is_needed(chunk: int) -> None:
    entries = [nccl_entry(i, i + 1) for i in range(13)]
    blob = _json_dump(entries)
    decoded = [e for part in entries_from(blob, 11, chunk=chunk) for e in part]
    assert [e.record_id for e in decoded] == [11, 12]
    # "record_id":1 is a prefix of "record_id":11: the search must not stop there.
    assert [e.record_id for p in entries_from(blob, 1, chunk) for e in p] == list(range(1, 13))
    assert [e.record_id for p in entries_from(blob, 99, chunk) for e in p] == list(range(13))
    assert max(len(p) for p in entries_from(blob, 0, chunk)) <= chunk
    assert list(entries_from(_json_dump([]), 0)) == []
    assert list(entries_from(b'{"version": "2.10"}', 0)) == []
    # One entry the typed decoder refuses: the others are kept.
    odd = [*entries[:2], {**entries[2], "record_id": "three"}, *entries[3:5]]
    kept = [e.record_id for p in entries_from(_json_dump(odd), 0, chunk) for e in p]
    assert kept == [0, 1, 3, 4]


def _names(group: str, desc: str) -> GroupName:
    return GroupName("dp" if group == "1" else "world", "intra_node", 2)


class ScriptedSource:
    """A recorder whose successive dumps are scripted (the last one repeats)."""

    def __init__(self, dumps: list[Any], *, json_form: bool) -> None:
        self.dumps = dumps
        self.calls = 0
        self.json_form = json_form

    def __call__(self) -> Any:
        dump = self.dumps[min(self.calls, len(self.dumps) - 1)]
        self.calls += 1
        return _json_dump(dump["entries"]) if self.json_form else dump

    def source(self, name: str = "generic") -> DumpSource:
        return DumpSource(name, self, json=self.json_form, native=False)


def _reader(*sources: DumpSource, **kwargs: Any) -> CollectiveReader:
    return CollectiveReader(list(sources), _names, log=RateLimitedLog(60.0), **kwargs)


@pytest.mark.parametrize("json_form", [True, False])
def test_reads_a_real_gloo_recorder_incrementally(json_form: bool) -> None:
    start = gloo_dump("gloo-rank0-waiting.json")
    base = {"entries": start["entries"][:4]}  # before the agent: three all_reduces, an all_gather
    scripted = ScriptedSource([base, start, gloo_dump("gloo-rank0-end.json")], json_form=json_form)
    reader = _reader(scripted.source())
    assert reader.baseline() == 4
    assert reader.read_once() == 2  # the broadcast and the barrier; the all_reduce is open
    records = reader.records()
    assert [(t.op, t.axis, t.calls, t.bytes) for t in records.traffic] == [
        ("broadcast", "world", 1, 1024)
    ]
    dp = next(g for g in records.groups if g.group == "1")
    assert dp.pending is not None and (dp.pending.seq, dp.pending.op) == (5, "all_reduce")
    assert reader.read_once() == 2  # the all_reduce completed; one more barrier
    records = reader.records()
    assert [(t.op, t.calls) for t in records.traffic] == [("all_reduce", 1), ("broadcast", 1)]
    assert all(g.pending is None for g in records.groups)
    assert not records.durations and records.lost_total == 0


def test_progress_starts_from_the_ops_before_the_agent_and_known_groups_from_nothing() -> None:
    """What a rank entered before its agent started counts as entered (no traffic), and a group
    it belongs to but never used shows 0: a rank stuck before its first collective on it is
    behind the ranks that wait there (docs/definitions.md#hangs)."""
    start = gloo_dump("gloo-rank0-waiting.json")
    base = {"entries": start["entries"][:4]}  # #1-#4 of group "1", before the agent
    reader = _reader(
        ScriptedSource([base], json_form=True).source(), groups=[("1", ""), ("7", "mesh_tp")]
    )
    reader.baseline()
    records = reader.records()
    assert records.traffic == ()
    assert [(g.group, g.entered_seq, g.completed_seq) for g in records.groups] == [
        ("1", 4, 4),
        ("7", 0, 0),
    ]


def test_nccl_durations_and_a_duplicate_binding_of_one_ring() -> None:
    entries = [nccl_entry(i, i + 1, shape=(1024,), duration_ms=2.0) for i in range(3)]
    first = ScriptedSource([nccl_dump(entries[:1]), nccl_dump(entries)], json_form=False)
    # The same ring behind a second binding (newer torch), one op later: read once, not twice.
    second = ScriptedSource([nccl_dump(entries[:2]), nccl_dump(entries)], json_form=False)
    reader = _reader(first.source("generic"), second.source("nccl"))
    reader.baseline()
    reader.read_once()
    (traffic,) = reader.records().traffic
    assert (traffic.calls, traffic.seconds, traffic.sized_seconds) == (2, 0.004, 0.004)
    # Two rings of their own (gloo and NCCL before torch merged them): both are read.
    gloo = ScriptedSource([gloo_dump("gloo-rank0-waiting.json")], json_form=True)
    own = ScriptedSource([nccl_dump(entries[:1])], json_form=False)
    both = _reader(gloo.source("generic"), own.source("nccl"))
    both.baseline()
    both.read_once()
    assert own.calls == 2
    assert reader.records().durations  # seen in the entries
    assert second.calls == 1  # dropped after the baseline


def test_arrival_samples_follow_the_steps() -> None:
    t0 = 1_763_700_000_000_000_000
    entries = [nccl_entry(i, i + 1, created_ns=t0 + i * 10) for i in range(6)]
    # Two step starts, the read's dump, then three batches' `records`.
    clock = iter([t0 - 1, t0 + 25, t0 + 50, t0 + 60, t0 + 61, t0 + 62])
    scripted = ScriptedSource([nccl_dump([]), nccl_dump(entries)], json_form=False)
    reader = _reader(scripted.source(), wall_clock_ns=lambda: next(clock))
    reader.baseline()
    reader.step_began(0)
    reader.step_began(1)
    reader.read_once()
    samples = reader.records("http").arrivals
    assert [(a.seq, a.enqueued_unix_ns - t0) for a in samples] == [(1, 0), (4, 30)]
    assert reader.records("http").arrivals == ()  # each sink gets each sample once
    assert reader.records("jsonl").arrivals == samples


def test_each_steps_collective_seconds_once_the_step_is_whole() -> None:
    t0 = 1_763_700_000_000_000_000
    ms = 1_000_000

    def op(i: int, at_ms: int, done: bool = True) -> dict[str, Any]:
        return nccl_entry(i, i + 1, created_ns=t0 + at_ms * ms, duration_ms=1.5, completed=done)

    first = [op(0, 10), op(1, 20), op(2, 110, done=False)]
    then = [op(0, 10), op(1, 20), op(2, 110), op(3, 210)]
    scripted = ScriptedSource([nccl_dump([]), nccl_dump(first), nccl_dump(then)], json_form=False)
    now = [t0]
    reader = _reader(scripted.source(), wall_clock_ns=lambda: now[0])
    reader.baseline()
    for step in range(3):
        reader.step_began(step, t0 + step * 100 * ms)
    now[0] = t0 + 250 * ms
    reader.read_once()  # step 1's all_reduce still runs: step 0 alone is whole
    update = reader.step_durations()
    assert update.timed and update.through == 0
    assert update.steps == {0: {("all_reduce", "world", "intra_node"): pytest.approx(0.003)}}
    now[0] = t0 + 300 * ms
    reader.read_once()
    assert reader.step_durations().steps == {1: {("all_reduce", "world", "intra_node"): 0.0015}}
    reader.close(0.0)  # no step begins after the close: the last one is whole
    assert reader.step_durations().steps == {2: {("all_reduce", "world", "intra_node"): 0.0015}}


def test_without_durations_no_step_is_handed_on() -> None:
    scripted = ScriptedSource([gloo_dump("gloo-rank0-end.json")], json_form=True)
    reader = _reader(scripted.source())
    reader.step_began(0, 0)
    reader.read_once()
    reader.close(0.0)
    update = reader.step_durations()
    assert not update.timed and update.steps == {}


def test_close_waits_briefly_for_the_last_open_collective() -> None:
    entries = [nccl_entry(0, 1, completed=False)]
    later = [nccl_entry(0, 1, completed=True)]
    scripted = ScriptedSource(
        [nccl_dump([]), nccl_dump(entries), nccl_dump(entries), nccl_dump(later)], json_form=False
    )
    now = [0.0]
    pauses: list[float] = []

    def sleep(seconds: float) -> None:
        pauses.append(seconds)
        now[0] += seconds

    reader = _reader(scripted.source(), interval_s=30.0, clock=lambda: now[0], sleep=sleep)
    reader.baseline()
    periodic = Periodic(RateLimitedLog(60.0), clock=time.monotonic)
    reader.start(periodic)
    reader.close(5.0)
    periodic.stop()
    assert reader.taken == 1 and reader.open_entries == 0
    assert pauses == [0.02, 0.02]  # short pauses between reads until the op was done


def test_a_failing_recorder_is_logged_and_the_reader_goes_on(caplog: Any) -> None:
    calls = []

    def broken() -> Any:
        calls.append(1)
        raise RuntimeError("dump exploded")

    reader = _reader(DumpSource("generic", broken, json=False, native=False), interval_s=0.05)
    # Two rounds of the periodic task: each one tries the recorder, logs, and asks to run again
    # after the usual interval.
    assert reader.tick() == 0.05
    assert reader.tick() == 0.05
    assert len(calls) == 2 and reader.reads == 0
    failures = [r for r in caplog.records if "dump exploded" in r.getMessage()]
    assert len(failures) == 1  # logged once per interval, not once per read


def test_enable_flight_recorder_respects_the_users_choice() -> None:
    env: dict[str, str] = {}
    assert enable_flight_recorder(env) and env == {"TORCH_FR_BUFFER_SIZE": "2000"}
    assert ring_entries(env) == 2000
    off = {"TORCH_FR_BUFFER_SIZE": "0"}
    assert not enable_flight_recorder(off) and off == {"TORCH_FR_BUFFER_SIZE": "0"}
    legacy = {"TORCH_NCCL_TRACE_BUFFER_SIZE": "20000"}
    assert not enable_flight_recorder(legacy) and ring_entries(legacy) == 20000


def test_nccl_timing_is_turned_on_for_nccl_groups_only(monkeypatch: pytest.MonkeyPatch) -> None:
    from torch.distributed import distributed_c10d as c10d

    class ProcessGroupNCCL:
        pass

    class ProcessGroupGloo:
        pass

    class FakeGroup:
        def __init__(self, backend: object) -> None:
            self.backend = backend
            self.timed = False

        def _get_backend(self, device: Any) -> object:
            if self.backend is None:
                raise RuntimeError("no CUDA backend")
            return self.backend

        def _enable_collectives_timing(self) -> None:
            self.timed = True

    groups = [FakeGroup(ProcessGroupNCCL()), FakeGroup(ProcessGroupGloo()), FakeGroup(None)]
    monkeypatch.setattr(c10d, "_world", SimpleNamespace(pg_group_ranks={g: {0: 0} for g in groups}))
    assert nccl_group_count() == 1 and not groups[0].timed
    assert enable_nccl_timing() == 1
    assert [g.timed for g in groups] == [True, False, False]


NATIVE_CHECK = """
import json
import torch, torch.distributed as dist
from mfuscope.agent.flight_recorder import dump_sources
# An in-process store: a port picked, freed and bound again can be taken in between.
dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
for _ in range(5):
    dist.all_reduce(torch.ones(8))
sources = dump_sources()
native = [s for s in sources if s.native]
binding = json.loads(torch._C._distributed_c10d._dump_fr_trace_json(True, False))
print(json.dumps({"native": [s.name for s in native],
                  "same": bool(native) and json.loads(native[0].dump()) == binding,
                  "entries": len(binding["entries"])}))
dist.destroy_process_group()
"""


@pytest.mark.slow  # a child Python process
@pytest.mark.skipif(
    sys.platform != "linux" or platform.machine() != "x86_64",
    reason="the native dump is used on Linux x86-64 only",
)
def test_native_dump_matches_the_binding_in_a_real_process() -> None:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    result = subprocess.run(
        [sys.executable, "-c", NATIVE_CHECK], env=env, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr[-3000:]
    found = json.loads(result.stdout.strip().splitlines()[-1])
    assert found == {"native": ["generic"], "same": True, "entries": 5}


def test_reader_logs_lost_entries_once(caplog: Any) -> None:
    caplog.set_level(logging.WARNING)
    first = [nccl_entry(i, i + 1) for i in range(3)]
    wrapped = [nccl_entry(i, i + 1) for i in range(10, 12)]
    scripted = ScriptedSource([nccl_dump(first[:1]), nccl_dump(wrapped)], json_form=False)
    reader = _reader(scripted.source())
    reader.baseline()
    reader.read_once()
    assert reader.records().lost_total == 9
    assert sum("overwritten" in r.getMessage() for r in caplog.records) == 1


@pytest.mark.slow  # a child Python process (a fresh import)
@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({}, "2000"),
        ({"MFUSCOPE_COLLECTIVE_RECORDS": "0"}, "unset"),
        ({"TORCH_FR_BUFFER_SIZE": "0"}, "0"),
    ],
)
def test_importing_the_agent_asks_for_the_recorder(env: dict[str, str], expected: str) -> None:
    base = {k: v for k, v in os.environ.items() if not k.startswith(("MFUSCOPE_", "TORCH_"))}
    code = (
        "import os, sys, mfuscope.agent; "
        "print(os.environ.get('TORCH_FR_BUFFER_SIZE', 'unset'), 'torch' in sys.modules)"
    )
    result = subprocess.run(
        [sys.executable, "-c", code],
        env={**base, **env},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == [expected, "False"]  # and torch is not imported for it


@pytest.mark.parametrize("json_form", [True, False])
def test_a_recorder_reset_starts_the_count_again(json_form: bool) -> None:
    before = [nccl_entry(i, i + 1) for i in range(5)]
    after = [nccl_entry(i, 10 + i) for i in range(2)]  # reset_all: ids from 0 again
    scripted = ScriptedSource(
        [nccl_dump(before[:2]), nccl_dump(before), nccl_dump(after)], json_form=json_form
    )
    reader = _reader(scripted.source())
    reader.baseline()
    assert reader.read_once() == 3
    assert reader.read_once() == 2
    assert reader.records().traffic[0].calls == 5
