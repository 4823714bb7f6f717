"""Entries of PyTorch's c10d flight recorder, read incrementally (pure: plain data in and out).

The flight recorder is a ring buffer inside every process that records each collective and
point-to-point op a process group enqueues. Its dump (``torch._C._distributed_c10d._dump_fr_trace``
and ``_dump_fr_trace_json``; ``_dump_nccl_trace*`` for NCCL's own recorder) returns the whole
buffer. The field names read here are the dump keys that PyTorch defines in
``torch/csrc/distributed/c10d/FlightRecorder.hpp`` (dump version 2.10) and fills in
``FlightRecorderDetail.hpp``: ``record_id`` (a counter over the recorder), ``process_group``
(``[name, description]``), ``collective_seq_id`` / ``p2p_seq_id`` (per group), ``is_p2p``,
``profiling_name`` (``gloo:all_reduce``, ``nccl:all_reduce``, ``nccl:send 0->1``,
``nccl:all_reduce_barrier``, ``nccl:coalesced``), ``input_sizes`` / ``output_sizes`` (one shape
per tensor), ``input_dtypes`` / ``output_dtypes`` (``c10::ScalarType`` names), ``time_created_ns``
(the host's wall clock when the op was enqueued), ``duration_ms`` (only with NCCL timing on: the
time between the op's start and end events on the GPU), ``state`` (``scheduled``, ``started``,
``completed``) and ``retired`` (the backend is done with the op). The JSON dump writes 0 for an
absent ``time_discovered_*``; the pickle writes None.

`RecordTracker` turns successive dumps into what is new: each op once, when it is done (so its
duration, where there is one, is known), never twice across dumps, with a count of entries the
ring overwrote before they were read. A backend sets ``retired`` when the op completes (gloo on its
worker thread, NCCL from its watchdog): an op enqueued and not done is one this process is
waiting in, the basis of hang attribution (docs/definitions.md#hangs).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import msgspec
from mfuscope.core.trace import BOOKKEEPING, dtype_size, normalise_op

__all__ = [
    "BARRIER",
    "FlightEntry",
    "RawEntry",
    "RecordTracker",
    "TrackerUpdate",
    "entry_from_dump",
    "entry_from_raw",
    "op_of_profiling_name",
]

# A barrier moves no data of its own but is what a rank waits in before a checkpoint or at start:
# hang attribution names it; traffic counters leave it out (as the nccl-tests ops do).
BARRIER = "barrier"


@dataclass(frozen=True, slots=True)
class FlightEntry:
    """One recorder entry. `op` is the nccl-tests op name, `BARRIER`, or None (an op that moves
    data but names no single op, ``coalesced``, or one mfuscope does not know). `seq` is the
    group's collective sequence number (the p2p one for point-to-point ops). `size_bytes` is the
    nccl-tests size S, the larger of the input and output element counts times the element size
    (None when a dtype is unknown or the op has no tensors). `duration_s` is None without timing."""

    record_id: int
    group: str
    group_desc: str
    backend: str
    op: str | None
    seq: int
    is_p2p: bool
    size_bytes: int | None
    created_unix_ns: int
    duration_s: float | None
    done: bool


class RawEntry(msgspec.Struct, kw_only=True):
    """The fields of a dump entry mfuscope reads, as the JSON dump spells them (a typed decoder
    builds these straight from the dump's bytes; unknown fields are skipped)."""

    record_id: int
    process_group: tuple[str, str]
    collective_seq_id: int = 0
    p2p_seq_id: int = 0
    is_p2p: bool = False
    profiling_name: str
    time_created_ns: int
    input_sizes: list[list[int]] = []
    input_dtypes: list[str] = []
    output_sizes: list[list[int]] = []
    output_dtypes: list[str] = []
    duration_ms: float | None = None
    retired: bool = False
    state: str = ""


_OPS: dict[str, tuple[str, str | None]] = {}


def op_of_profiling_name(name: str) -> tuple[str, str | None]:
    """(backend, op) of a recorder ``profiling_name``: ``nccl:send 0->1`` -> (``nccl``, ``send``),
    ``nccl:all_reduce_barrier`` -> (``nccl``, `BARRIER`), ``nccl:coalesced`` -> (``nccl``, None)."""
    known = _OPS.get(name)
    if known is not None:
        return known
    backend, _, rest = name.partition(":")
    if not rest:
        backend, rest = "", name
    stem = rest.strip().split(" ", 1)[0]
    if BARRIER in stem.lower():
        found: tuple[str, str | None] = (backend, BARRIER)
    else:
        op = normalise_op(stem)
        found = (backend, None if op in (None, BOOKKEEPING) else op)
    if len(_OPS) < 4096:  # names carry peers ("nccl:send 0->1"): bounded anyway
        _OPS[name] = found
    return found


def _side_bytes(shapes: list[list[int]], dtypes: list[str]) -> int:
    """Bytes of one side's tensors when they share one known element size, else 0."""
    if not dtypes:
        return 0
    width = dtype_size(dtypes[0])
    if width is None or any(dtype_size(d) != width for d in dtypes[1:]):
        return 0
    elements = 0
    for shape in shapes:
        if any(d < 0 for d in shape):
            return 0
        elements += math.prod(shape)
    return elements * width


def entry_from_raw(raw: RawEntry) -> FlightEntry:
    """A decoded entry as a `FlightEntry` (size S: the larger side, see `FlightEntry`)."""
    backend, op = op_of_profiling_name(raw.profiling_name)
    size = 0
    if op != BARRIER:
        size = max(
            _side_bytes(raw.input_sizes, raw.input_dtypes),
            _side_bytes(raw.output_sizes, raw.output_dtypes),
        )
    duration_ms = raw.duration_ms
    return FlightEntry(
        record_id=raw.record_id,
        group=raw.process_group[0],
        group_desc=raw.process_group[1],
        backend=backend,
        op=op,
        seq=raw.p2p_seq_id if raw.is_p2p else raw.collective_seq_id,
        is_p2p=raw.is_p2p,
        size_bytes=size or None,
        created_unix_ns=raw.time_created_ns,
        duration_s=duration_ms / 1e3
        if duration_ms is not None and math.isfinite(duration_ms) and duration_ms >= 0
        else None,
        done=raw.retired or raw.state == "completed",
    )


def entry_from_dump(raw: Any) -> FlightEntry | None:
    """One dump entry (a dict from the pickle dump, or decoded JSON) as a `FlightEntry`; None
    when it lacks what every entry has (an entry of another dump version, or garbage)."""
    try:
        return entry_from_raw(msgspec.convert(raw, RawEntry))
    except (msgspec.ValidationError, TypeError, ValueError):
        return None


@dataclass(frozen=True)
class TrackerUpdate:
    """What one dump added: the entries done since the previous dump (each exactly once, in
    record order), the entries still open (enqueued, not done), and how many entries the ring
    overwrote before any dump saw them done (`lost`: counted nowhere else)."""

    done: tuple[FlightEntry, ...]
    open: tuple[FlightEntry, ...]
    lost: int


class RecordTracker:
    """Takes successive dumps of one recorder and yields each entry once, when it is done.

    State: `next_id`, the lowest record id not yet taken (every lower one was taken or lost), and
    the ids taken above it (entries complete out of order: gloo runs a group's ops on several
    worker threads). Bounded by the ring's size. A dump whose highest id is below `next_id` comes
    after the recorder was reset (``reset_all`` restarts ids at 0): tracking starts again.
    `baseline` dumps mark what is in the ring as seen without yielding it (the ops before the
    agent started)."""

    def __init__(self) -> None:
        self.next_id = 0
        self._taken: set[int] = set()
        self._highest_seen = -1

    def baseline(self, entries: Iterable[FlightEntry]) -> None:
        """Mark every entry of this dump as already taken (ops enqueued before tracking began;
        an op still open at that point is never counted)."""
        highest = max((e.record_id for e in entries), default=-1)
        self.next_id = highest + 1
        self._highest_seen = highest
        self._taken.clear()

    def update(self, entries: Iterable[FlightEntry]) -> TrackerUpdate:
        """The entries of a new dump (in record order, as the recorder dumps them)."""
        fresh = [e for e in entries if e.record_id >= 0]
        if not fresh:
            return TrackerUpdate((), (), 0)
        highest = max(e.record_id for e in fresh)
        if highest < self._highest_seen:
            # The recorder was reset: ids started again from 0.
            self.next_id = 0
            self._taken.clear()
        self._highest_seen = highest
        lowest = min(e.record_id for e in fresh)
        lost = 0
        if lowest > self.next_id:
            # Overwritten before they were seen done: the open ones among them are lost too.
            skipped_taken = sum(1 for i in self._taken if i < lowest)
            lost = lowest - self.next_id - skipped_taken
            self._taken = {i for i in self._taken if i >= lowest}
            self.next_id = lowest
        done: list[FlightEntry] = []
        still_open: list[FlightEntry] = []
        for entry in fresh:
            rid = entry.record_id
            if rid < self.next_id or rid in self._taken:
                continue
            if entry.done:
                done.append(entry)
                self._taken.add(rid)
            else:
                still_open.append(entry)
        while self.next_id in self._taken:
            self._taken.discard(self.next_id)
            self.next_id += 1
        return TrackerUpdate(tuple(done), tuple(still_open), lost)
