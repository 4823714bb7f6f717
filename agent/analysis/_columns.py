"""Numeric columns of the device events and launches, as the C selection read them.

The timeline needs, per kernel, memcpy/memset and runtime launch, only a few numbers (``ts``,
``dur``, ``pid``, ``args.correlation``). Read from the decoded Structs, each costs a pointer
chase per event (measured ~300 ns per kernel for ``args.correlation`` on the 2M-event trace,
64 ns when cache-resident), so `_select_c` also returns them as packed records, read with
certainty or not at all (see ``read_columns`` in ``_select.c``): the records are in file
order and, per bucket, line up with `_scan`'s kernels, memops and runtime lists. The
timeline checks the lengths and otherwise reads the Structs (`_kineto`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from mfuscope.agent.analysis._intervals import FloatArray
from numpy.typing import NDArray

__all__ = ["DeviceColumns", "EventColumns", "LaunchIndex"]

# The record layout written by `columns_of` in _select.c.
_RECORD = np.dtype(
    {
        "names": ["ts", "dur", "pid", "correlation", "bucket", "has_correlation"],
        "formats": ["<f8", "<f8", "<i8", "<i8", "u1", "u1"],
        "offsets": [0, 8, 16, 24, 32, 33],
        "itemsize": 40,
    }
)
_KERNEL, _MEMOP, _LAUNCH = 1, 2, 3
IntArray = NDArray[np.int64]


@dataclass(frozen=True, slots=True)
class EventColumns:
    """One bucket's columns, in file order (``dur`` and ``pid`` unread for launches)."""

    ts: FloatArray
    dur: FloatArray
    pid: IntArray
    correlation: IntArray
    has_correlation: NDArray[np.bool_]

    def __len__(self) -> int:
        return len(self.ts)


@dataclass(frozen=True, slots=True)
class DeviceColumns:
    """The columns of the kernels, memory ops and launches `read_trace` kept."""

    kernels: EventColumns
    memops: EventColumns
    launches: EventColumns

    @classmethod
    def from_records(cls, records: bytes) -> DeviceColumns:
        table = np.frombuffer(records, dtype=_RECORD)

        def bucket(code: int) -> EventColumns:
            rows = table[table["bucket"] == code]
            return EventColumns(
                ts=rows["ts"].copy(),
                dur=rows["dur"].copy(),
                pid=rows["pid"].copy(),
                correlation=rows["correlation"].copy(),
                has_correlation=rows["has_correlation"].astype(bool),
            )

        return cls(bucket(_KERNEL), bucket(_MEMOP), bucket(_LAUNCH))


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
