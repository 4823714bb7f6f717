"""Numeric columns of the device events and launches, as the C selection read them.

The timeline needs, per kernel, memcpy/memset and runtime launch, only a few numbers (``ts``,
``dur``, ``pid``, ``args.correlation``, a launch's ``tid``). Read from decoded Structs, each
costs a pointer chase per event (figures: benchmarks/RESULTS.md#reading), and decoding the
events costs more. So
`_select_c` also returns them as packed records, read with certainty or not at all (see
``read_columns`` in ``_select.c``). With columns, the document is decoded without the device
events the analysis reads only as numbers (every kernel but communication, every memory op)
and the launches only they name: those are in the columns alone (``decoded`` False). The
records are in file order; per bucket, the decoded ones line up with `_scan`'s kernels,
memops and runtime lists, which `usable_columns` checks.
"""

from __future__ import annotations

from collections.abc import Sequence

import msgspec
import numpy as np
from mfuscope.core.errors import TraceError
from mfuscope.core.trace._events import KinetoTrace
from mfuscope.core.trace._intervals import FloatArray
from mfuscope.core.trace._scan import ScannedEvents
from numpy.typing import NDArray

__all__ = ["DeviceColumns", "EventColumns", "LaunchIndex", "usable_columns"]

# The record layout written by `columns_of` in _select.c.
_RECORD = np.dtype(
    {
        "names": [
            "ts",
            "dur",
            "pid",
            "correlation",
            "tid",
            "bucket",
            "has_correlation",
            "kept",
            "name",
        ],
        "formats": ["<f8", "<f8", "<i8", "<i8", "<i8", "u1", "u1", "u1", "<u4"],
        "offsets": [0, 8, 16, 24, 32, 40, 41, 42, 44],
        "itemsize": 48,
    }
)
_KERNEL, _MEMOP, _LAUNCH = 1, 2, 3
_NO_NAME = 0xFFFFFFFF
IntArray = NDArray[np.int64]


class EventColumns(msgspec.Struct, frozen=True):
    """One bucket's columns, in file order (``dur`` and ``pid`` unread for launches, ``tid``
    for device events). `decoded`: the event is in the decoded document too (the rows where
    it is line up, in order, with `_scan`'s list of the bucket)."""

    ts: FloatArray
    dur: FloatArray
    pid: IntArray
    correlation: IntArray
    has_correlation: NDArray[np.bool_]
    tid: IntArray
    decoded: NDArray[np.bool_]
    name: IntArray  # kernels: position in `DeviceColumns.kernel_names`, -1 if not read

    def __len__(self) -> int:
        return len(self.ts)


class DeviceColumns(msgspec.Struct, frozen=True):
    """The columns of the kernels, memory ops and launches `read_trace` kept, and the
    distinct kernel names (None: not UTF-8) that `kernels.name` points into."""

    kernels: EventColumns
    memops: EventColumns
    launches: EventColumns
    kernel_names: tuple[str | None, ...] = ()

    @classmethod
    def from_records(cls, records: bytes, kernel_names: Sequence[str | None] = ()) -> DeviceColumns:
        table = np.frombuffer(records, dtype=_RECORD)

        def bucket(code: int) -> EventColumns:
            rows = table[table["bucket"] == code]
            return EventColumns(
                ts=rows["ts"].copy(),
                dur=rows["dur"].copy(),
                pid=rows["pid"].copy(),
                correlation=rows["correlation"].copy(),
                has_correlation=rows["has_correlation"].astype(bool),
                tid=rows["tid"].copy(),
                decoded=rows["kept"].astype(bool),
                name=np.where(rows["name"] == _NO_NAME, -1, rows["name"]).astype(np.int64),
            )

        return cls(bucket(_KERNEL), bucket(_MEMOP), bucket(_LAUNCH), tuple(kernel_names))

    def line_up_with(self, kernels: int, memops: int, launches: int) -> bool:
        """Whether the decoded rows match the lengths of `_scan`'s buckets."""
        decoded = (self.kernels.decoded, self.memops.decoded, self.launches.decoded)
        return tuple(int(rows.sum()) for rows in decoded) == (kernels, memops, launches)

    def has_device_events(self) -> bool:
        return len(self.kernels) > 0 or len(self.memops) > 0


class LaunchIndex:
    """Position of the launch of each correlation id; a later duplicate wins (as `_kineto`'s
    dict build of the decoded events does)."""

    def __init__(self, launches: EventColumns) -> None:
        positions = np.flatnonzero(launches.has_correlation)
        ids = launches.correlation[positions]
        order = np.argsort(ids, kind="stable")  # equal ids stay in file order
        ids, positions = ids[order], positions[order]
        last = np.ones(len(ids), dtype=bool)
        np.not_equal(ids[1:], ids[:-1], out=last[:-1])  # the last of each run of equal ids
        self._ids, self._positions = ids[last], positions[last]

    def __len__(self) -> int:
        return len(self._ids)

    def lookup(self, events: EventColumns) -> NDArray[np.intp]:
        """The launch position of each event; -1 for none."""
        if len(self._ids) == 0:
            return np.full(len(events), -1, dtype=np.intp)
        at = np.minimum(np.searchsorted(self._ids, events.correlation), len(self._ids) - 1)
        found = events.has_correlation & (self._ids[at] == events.correlation)
        return np.where(found, self._positions[at], -1).astype(np.intp)


def usable_columns(trace: KinetoTrace, scanned: ScannedEvents) -> DeviceColumns | None:
    """The columns `read_trace` read, or None if it read none.

    A trace read with columns lacks the device events they stand for, so it cannot be analysed
    without them: columns whose decoded rows do not line up with the trace's events (a trace
    changed after `read_trace`) raise `TraceError` rather than give a wrong analysis.
    """
    columns = trace.columns
    if not isinstance(columns, DeviceColumns):
        return None
    if not columns.line_up_with(len(scanned.kernels), len(scanned.memops), len(scanned.runtime)):
        raise TraceError(None, "the trace's device columns do not match its events")
    return columns
