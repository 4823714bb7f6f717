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
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from mfuscope.core.trace._collectives import BOOKKEEPING, dtype_size, normalise_op

__all__ = [
    "BARRIER",
    "FlightEntry",
    "RecordTracker",
    "TrackerUpdate",
    "entry_from_dump",
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


def op_of_profiling_name(name: str) -> tuple[str, str | None]:
    """(backend, op) of a recorder ``profiling_name``: ``nccl:send 0->1`` -> (``nccl``, ``send``),
    ``nccl:all_reduce_barrier`` -> (``nccl``, `BARRIER`), ``nccl:coalesced`` -> (``nccl``, None)."""
    backend, _, rest = name.partition(":")
    if not rest:
        backend, rest = "", name
    stem = rest.strip().split(" ", 1)[0]
    if BARRIER in stem.lower():
        return backend, BARRIER
    op = normalise_op(stem)
    return backend, None if op in (None, BOOKKEEPING) else op


def _elements(shapes: Any) -> int | None:
    if not isinstance(shapes, (list, tuple)):
        return None
    total = 0
    for shape in shapes:
        if not isinstance(shape, (list, tuple)) or not all(
            isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape
        ):
            return None
        total += math.prod(shape)
    return total


def _element_size(dtypes: Any) -> int | None:
    """Bytes per element when every tensor has one known dtype of the same size."""
    if not isinstance(dtypes, (list, tuple)) or not dtypes:
        return None
    sizes = {dtype_size(d) for d in dtypes}
    if len(sizes) != 1 or None in sizes:
        return None
    (size,) = sizes
    return size


def _size_bytes(raw: Mapping[str, Any]) -> int | None:
    counts = []
    for shapes, dtypes in (("input_sizes", "input_dtypes"), ("output_sizes", "output_dtypes")):
        elements = _elements(raw.get(shapes))
        width = _element_size(raw.get(dtypes))
        if elements is not None and width is not None and elements > 0:
            counts.append(elements * width)
    return max(counts) if counts else None


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def entry_from_dump(raw: Any) -> FlightEntry | None:
    """One dump entry (a dict from the pickle or JSON dump) as a `FlightEntry`; None when it
    lacks what every entry has (an entry of another dump version, or garbage)."""
    if not isinstance(raw, Mapping):
        return None
    record_id = _int(raw.get("record_id"))
    group = raw.get("process_group")
    name = raw.get("profiling_name")
    created = _int(raw.get("time_created_ns"))
    is_p2p = raw.get("is_p2p") is True
    seq = _int(raw.get("p2p_seq_id" if is_p2p else "collective_seq_id"))
    if (
        record_id is None
        or created is None
        or seq is None
        or not isinstance(name, str)
        or not isinstance(group, (list, tuple))
        or len(group) != 2
    ):
        return None
    backend, op = op_of_profiling_name(name)
    duration_ms = raw.get("duration_ms")
    duration_s = (
        float(duration_ms) / 1e3
        if isinstance(duration_ms, (int, float))
        and not isinstance(duration_ms, bool)
        and math.isfinite(duration_ms)
        and duration_ms >= 0
        else None
    )
    return FlightEntry(
        record_id=record_id,
        group=str(group[0]),
        group_desc=str(group[1]),
        backend=backend,
        op=op,
        seq=seq,
        is_p2p=is_p2p,
        size_bytes=None if op == BARRIER else _size_bytes(raw),
        created_unix_ns=created,
        duration_s=duration_s,
        done=raw.get("retired") is True or raw.get("state") == "completed",
    )


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
