"""Flight-recorder entries: real gloo dumps, NCCL-shaped dumps, and incremental tracking."""

from __future__ import annotations

import dataclasses

import pytest
from mfuscope.core.flight_records import (
    BARRIER,
    FlightEntry,
    RecordTracker,
    entry_from_dump,
    op_of_profiling_name,
)

from tests.support.fr_dumps import gloo_dump, nccl_entry


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("gloo:all_reduce", ("gloo", "all_reduce")),
        ("gloo:all_gather", ("gloo", "all_gather")),
        ("nccl:_allgather_base", ("nccl", "all_gather")),
        ("nccl:_reduce_scatter_base", ("nccl", "reduce_scatter")),
        ("nccl:all_to_all", ("nccl", "all_to_all")),
        ("nccl:send 0->1", ("nccl", "send")),
        ("nccl:recv 1<-0", ("nccl", "recv")),
        ("nccl:all_reduce_barrier", ("nccl", BARRIER)),
        ("gloo:barrier", ("gloo", BARRIER)),
        ("nccl:coalesced", ("nccl", None)),
        ("custom:frobnicate", ("custom", None)),
    ],
)
def test_ops_from_profiling_names(name: str, expected: tuple[str, str | None]) -> None:
    assert op_of_profiling_name(name) == expected


def test_real_gloo_dump_while_a_peer_has_not_joined() -> None:
    dump = gloo_dump("gloo-rank0-waiting.json")
    entries = [entry_from_dump(raw) for raw in dump["entries"]]
    assert all(e is not None for e in entries)
    ops = [(e.group, e.op, e.seq, e.done) for e in entries if e is not None]
    assert ops == [
        ("1", "all_reduce", 1, True),
        ("1", "all_reduce", 2, True),
        ("1", "all_reduce", 3, True),
        ("1", "all_gather", 4, True),
        ("0", "broadcast", 1, True),
        ("0", BARRIER, 2, True),
        ("1", "all_reduce", 5, False),  # the one rank 1 has not joined
    ]
    first, gather, barrier = entries[0], entries[3], entries[5]
    assert first is not None and gather is not None and barrier is not None
    assert first.size_bytes == 256 * 4 and first.group_desc == "DATA_PARALLEL_GROUP"
    assert gather.size_bytes == 2 * 256 * 4  # S is the gathered array
    assert barrier.size_bytes is None
    assert first.duration_s is None  # gloo records no durations


def test_nccl_pickle_entry_with_timing() -> None:
    entry = entry_from_dump(nccl_entry(7, 3, duration_ms=2.5, dtype="BFloat16"))
    assert entry == FlightEntry(
        record_id=7,
        group="0",
        group_desc="default_pg",
        backend="nccl",
        op="all_reduce",
        seq=3,
        is_p2p=False,
        size_bytes=3 * 4 * 2,
        created_unix_ns=1_763_700_000_000_000_000,
        duration_s=0.0025,
        done=True,
    )
    untimed = entry_from_dump(nccl_entry(8, 4, duration_ms=None))
    assert untimed is not None and untimed.duration_s is None and untimed.done
    send = entry_from_dump(nccl_entry(9, 2, name="nccl:send 0->1", is_p2p=True))
    assert send is not None and (send.op, send.seq, send.is_p2p) == ("send", 2, True)
    running = entry_from_dump(nccl_entry(10, 5, completed=False))
    assert running is not None and not running.done


@pytest.mark.parametrize(
    "broken",
    [
        {"record_id": None},
        {"process_group": "0"},
        {"profiling_name": 3},
        {"time_created_ns": "soon"},
        {"collective_seq_id": True},
    ],
)
def test_entries_missing_what_every_entry_has_are_skipped(broken: dict[str, object]) -> None:
    assert entry_from_dump({**nccl_entry(1, 1), **broken}) is None
    assert entry_from_dump("not a dict") is None


def test_sizes_need_one_known_dtype() -> None:
    assert entry_from_dump(nccl_entry(1, 1, dtype="Quaternion")).size_bytes is None  # type: ignore[union-attr]
    mixed = {
        **nccl_entry(1, 1),
        "input_dtypes": ["Float", "Half"],
        "output_dtypes": ["Float", "Half"],
    }
    mixed["input_sizes"] = ((3, 4), (3, 4))
    mixed["output_sizes"] = ((3, 4), (3, 4))
    assert entry_from_dump(mixed).size_bytes is None  # type: ignore[union-attr]
    scattered = nccl_entry(1, 1, name="nccl:_reduce_scatter_base", shape=(8, 4), out_shape=(4, 4))
    assert entry_from_dump(scattered).size_bytes == 8 * 4 * 4  # type: ignore[union-attr]


def _entries(*specs: tuple[int, bool]) -> list[FlightEntry]:
    out = []
    for record_id, done in specs:
        entry = entry_from_dump(nccl_entry(record_id, record_id + 1, completed=done))
        assert entry is not None
        out.append(entry)
    return out


def test_tracker_takes_each_entry_once_when_done() -> None:
    tracker = RecordTracker()
    tracker.baseline(_entries((0, True), (1, True)))
    first = tracker.update(_entries((0, True), (1, True), (2, True), (3, False), (4, True)))
    assert [e.record_id for e in first.done] == [2, 4]
    assert [e.record_id for e in first.open] == [3]
    assert tracker.next_id == 3
    second = tracker.update(_entries((1, True), (2, True), (3, True), (4, True), (5, False)))
    assert [e.record_id for e in second.done] == [3]  # 4 was taken already
    assert [e.record_id for e in second.open] == [5]
    assert tracker.next_id == 5 and second.lost == 0
    again = tracker.update(_entries((3, True), (4, True), (5, False)))
    assert again.done == () and [e.record_id for e in again.open] == [5]


def test_tracker_counts_entries_the_ring_overwrote() -> None:
    tracker = RecordTracker()
    tracker.update(_entries((0, True), (1, False), (2, True)))
    # The ring now starts at 6: 1 (open when last seen), 3, 4 and 5 are gone; 2 was taken.
    update = tracker.update(_entries((6, True), (7, True)))
    assert update.lost == 4
    assert [e.record_id for e in update.done] == [6, 7]
    assert tracker.next_id == 8


def test_tracker_starts_again_after_a_recorder_reset() -> None:
    tracker = RecordTracker()
    tracker.update(_entries((0, True), (1, True), (2, True), (3, True)))
    update = tracker.update(_entries((0, True), (1, True)))  # reset_all: ids restart at 0
    assert [e.record_id for e in update.done] == [0, 1]


def test_baseline_hides_the_ops_before_the_agent() -> None:
    tracker = RecordTracker()
    tracker.baseline(_entries((0, True), (1, False)))
    later = [dataclasses.replace(e, done=True) for e in _entries((0, True), (1, True), (2, True))]
    assert [e.record_id for e in tracker.update(later).done] == [2]
