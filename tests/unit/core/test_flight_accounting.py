"""Traffic totals, group progress and arrival samples from flight-recorder entries."""

from __future__ import annotations

import pytest
from mfuscope.core.collective_records import ArrivalSample, CollectiveTraffic, PendingCollective
from mfuscope.core.flight_accounting import (
    ArrivalSampler,
    GroupName,
    ProgressTracker,
    StepDurations,
    TrafficTotals,
)
from mfuscope.core.flight_records import FlightEntry, entry_from_dump

from tests.support.fr_dumps import gloo_dump, nccl_entry

NAMES = {"0": GroupName("world", "intra_node", 2), "1": GroupName("dp", "inter_node", 2)}


def names(group: str, desc: str) -> GroupName:
    return NAMES.get(group, GroupName(f"pg{group}", "unknown", None))


def _entries(dump: dict) -> list[FlightEntry]:  # type: ignore[type-arg]
    found = [entry_from_dump(raw) for raw in dump["entries"]]
    return [e for e in found if e is not None]


def test_traffic_of_a_real_gloo_dump() -> None:
    totals = TrafficTotals()
    entries = _entries(gloo_dump("gloo-rank0-end.json"))
    totals.add([e for e in entries if e.done], names)
    assert totals.records() == (
        CollectiveTraffic(
            op="all_gather", axis="dp", tier="inter_node", group_size=2, calls=1, bytes=2048
        ),
        CollectiveTraffic(
            op="all_reduce", axis="dp", tier="inter_node", group_size=2, calls=4, bytes=4 * 1024
        ),
        CollectiveTraffic(
            op="broadcast", axis="world", tier="intra_node", group_size=2, calls=1, bytes=1024
        ),
    )
    assert totals.skipped == 0  # the barriers are no traffic, and not "skipped" either


def test_timed_nccl_entries_give_seconds_and_the_busbw_pair() -> None:
    totals = TrafficTotals()
    timed = [
        entry_from_dump(nccl_entry(0, 1, shape=(1024,), duration_ms=2.0)),
        entry_from_dump(nccl_entry(1, 2, shape=(1024,), duration_ms=3.0, dtype="Quaternion")),
        entry_from_dump(nccl_entry(2, 3, name="nccl:coalesced")),
    ]
    totals.add([e for e in timed if e is not None], names)
    (record,) = totals.records()
    # The second call has no known size: its time counts, not in the sized pair.
    assert record == CollectiveTraffic(
        op="all_reduce",
        axis="world",
        tier="intra_node",
        group_size=2,
        calls=2,
        bytes=4096,
        seconds=0.005,
        sized_seconds=0.002,
        sized_bytes=4096,
    )
    assert totals.skipped == 1  # the coalesced group names no single op


def test_progress_names_the_oldest_open_collective_per_group() -> None:
    tracker = ProgressTracker()
    entries = _entries(gloo_dump("gloo-rank0-waiting.json"))
    tracker.observe([e for e in entries if e.done], [e for e in entries if not e.done])
    waiting = entries[-1]
    now = waiting.created_unix_ns + 2_500_000_000
    world, dp = tracker.records(names, now)
    assert (world.group, world.entered_seq, world.completed_seq, world.pending) == ("0", 2, 2, None)
    assert (dp.axis, dp.tier, dp.size, dp.entered_seq, dp.completed_seq) == (
        "dp",
        "inter_node",
        2,
        5,
        4,
    )
    assert dp.pending == PendingCollective(seq=5, op="all_reduce", bytes=1024, waited_s=2.5)
    # The peer, just before it joins: it never entered #5.
    peer = ProgressTracker()
    before = _entries(gloo_dump("gloo-rank1-before.json"))
    peer.observe(before, [])
    assert [(g.group, g.entered_seq, g.pending) for g in peer.records(names, now)] == [
        ("0", 2, None),
        ("1", 4, None),
    ]
    # Once done, nothing is pending.
    tracker.observe([waiting], [])
    assert tracker.records(names, now)[1].pending is None


def test_groups_the_rank_belongs_to_are_reported_before_it_enters_them() -> None:
    # A rank stuck before its first collective on group "1" (its first step, NCCL's set-up)
    # reports it with nothing entered: behind whoever waits there.
    tracker = ProgressTracker(known=[("0", "default_pg"), ("1", "mesh_dp")])
    before = _entries(gloo_dump("gloo-rank1-before.json"))
    tracker.observe([e for e in before if e.group == "0"], [])
    records = tracker.records(names, 0)
    assert [(g.group, g.entered_seq, g.completed_seq, g.pending) for g in records] == [
        ("0", 2, 2, None),
        ("1", 0, 0, None),
    ]


def test_arrival_samples_are_the_first_completed_collective_of_each_step() -> None:
    base = 1_000_000_000_000
    created = [base + 10, base + 20, base + 110, base + 120, base + 210]
    done = [
        e
        for i, t in enumerate(created)
        if (e := entry_from_dump(nccl_entry(i, i + 1, created_ns=t))) is not None
    ]
    sampler = ArrivalSampler()
    sampler.observe(done[:3], [(7, base), (8, base + 100)])
    sampler.observe(done[3:], [(7, base), (8, base + 100), (9, base + 200)])
    samples, cursor = sampler.since(0)
    assert samples == (
        ArrivalSample("0", 1, base + 10),
        ArrivalSample("0", 3, base + 110),
        ArrivalSample("0", 5, base + 210),
    )
    assert sampler.since(cursor) == ((), 3)
    assert sampler.since(2) == (samples[2:], 3)  # another reader, behind: its own share
    early = entry_from_dump(nccl_entry(9, 10, created_ns=base - 5))
    assert early is not None
    sampler.observe([early], [(7, base)])  # before any known step: no sample
    assert sampler.since(cursor) == ((), 3)


def test_arrival_samples_are_bounded_for_a_reader_that_never_comes() -> None:
    base = 1_000_000_000_000
    sampler = ArrivalSampler(max_kept=2)
    entries = [entry_from_dump(nccl_entry(i, i + 1, created_ns=base + i)) for i in range(4)]
    steps = [(i, base + i) for i in range(4)]
    sampler.observe([e for e in entries if e is not None], steps)
    samples, cursor = sampler.since(0)
    assert [s.seq for s in samples] == [3, 4] and cursor == 4


T0 = 1_763_700_000_000_000_000
MS = 1_000_000


def _timed(
    record_id: int, at_ms: float, duration_ms: float | None = 2.0, **kw: object
) -> FlightEntry:
    entry = entry_from_dump(
        nccl_entry(
            record_id, record_id + 1, created_ns=T0 + int(at_ms * MS), duration_ms=duration_ms, **kw
        )  # type: ignore[arg-type]
    )
    assert entry is not None
    return entry


def test_step_durations_are_handed_on_once_each_step_is_whole() -> None:
    starts = [(0, T0), (1, T0 + 100 * MS), (2, T0 + 200 * MS)]
    durations = StepDurations()
    done = [_timed(0, 10), _timed(1, 20, 3.0), _timed(2, 110), _timed(3, 210)]
    durations.add(done, starts, names)
    # Dumped at 150 ms: step 0's successor had begun, step 1's had not.
    durations.advance((), starts, T0 + 150 * MS)
    update = durations.take()
    assert update.timed and update.through == 0
    assert update.steps == {0: {("all_reduce", "world", "intra_node"): 0.005}}
    assert durations.take().steps == {}  # each step once
    # Dumped at 250 ms, an op of step 1 still open: step 1 waits for it.
    durations.advance([_timed(4, 120, None, completed=False)], starts, T0 + 250 * MS)
    assert durations.take().through == 0
    durations.add([_timed(4, 120, 1.0)], starts, names)
    durations.advance((), starts, T0 + 250 * MS)
    update = durations.take()
    assert update.through == 1
    assert update.steps == {1: {("all_reduce", "world", "intra_node"): pytest.approx(0.003)}}
    # At the agent's close no step begins any more: the last one is whole too.
    durations.complete_all(starts)
    assert durations.take().steps == {2: {("all_reduce", "world", "intra_node"): 0.002}}


def test_a_step_whose_ops_are_not_all_known_is_handed_on_without_durations() -> None:
    starts = [(0, T0), (1, T0 + 100 * MS), (2, T0 + 200 * MS), (3, T0 + 300 * MS)]
    durations = StepDurations()
    done = [
        _timed(0, 10),
        _timed(1, 110, None),  # not timed (a group made after timing was turned on)
        _timed(2, 120, name="nccl:all_reduce_barrier"),  # a barrier: left out
        _timed(3, 210, name="nccl:coalesced"),  # a batch the recorder names no op for
    ]
    durations.add(done, starts, names)
    durations.advance((), starts, T0 + 350 * MS)
    update = durations.take()
    assert update.through == 2 and update.steps == {
        0: {("all_reduce", "world", "intra_node"): 0.002},
        1: None,
        2: None,
    }
    # Entries lost to the ring: the steps not whole yet are not all known (step 4 too: a lost
    # entry may be one of its first).
    starts.append((4, T0 + 400 * MS))
    durations.advance((), starts, T0 + 450 * MS, lost=2)
    assert durations.take().steps == {3: None}
    durations.complete_all(starts)
    assert durations.take().steps == {4: None}


def test_a_step_without_collectives_is_known_to_have_none() -> None:
    starts = [(0, T0), (1, T0 + 100 * MS)]
    durations = StepDurations()
    durations.add([_timed(9, -5)], starts, names)  # before any step: of none
    durations.advance((), starts, T0 + 150 * MS)
    assert durations.take().steps == {0: {}}
