"""Decoding only the new part of a flight-recorder JSON dump, a few entries at a time.

A dump is the whole ring (about 470 bytes per entry), but a reader needs only the entries from the
oldest one it has not taken yet. Decoding all of them would hold the GIL for milliseconds; this
finds where the needed entries start and decodes them in chunks, yielding the GIL between chunks
so the training thread never waits long for it.

What the search relies on (the JSON that ``FlightRecorder::dump_json`` builds with nlohmann::json,
``torch/csrc/distributed/c10d/FlightRecorderDetail.hpp``, written compactly by ``dump()``, with no
whitespace between tokens): ``"entries"`` is a list of flat objects
(their values are numbers, strings, booleans, null and lists of lists of numbers, never objects),
so ``},{`` appears only between two entries and ``}]`` only at the list's end; each entry has one
``"record_id":N``. Whatever the key order, these hold.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import msgspec
from mfuscope.core.flight_records import RawEntry, entry_from_dump

__all__ = ["entries_from"]

_ENTRIES = b'"entries":['
_SEPARATOR = b"},{"
_END = b"}]"
_TYPED = msgspec.json.Decoder(list[RawEntry])
_UNTYPED = msgspec.json.Decoder()


def _first_needed(blob: bytes, begin: int, end: int, record_id: int) -> int:
    """Offset of the entry with `record_id` (or of the first entry when it is not there)."""
    key = b'"record_id":%d' % record_id
    at = blob.find(key, begin, end)
    while at >= 0 and blob[at + len(key) : at + len(key) + 1] not in (b",", b"}"):
        at = blob.find(key, at + len(key), end)  # a longer id starting with the same digits
    if at < 0:
        return begin
    separator = blob.rfind(_SEPARATOR, begin, at)
    return begin if separator < 0 else separator + 2


def _decode(piece: bytes) -> list[RawEntry]:
    try:
        return _TYPED.decode(piece)
    except msgspec.ValidationError:  # an odd entry: keep the others
        raw: Any = _UNTYPED.decode(piece)
        checked = (msgspec.convert(e, RawEntry) for e in raw if entry_from_dump(e) is not None)
        return list(checked)


def entries_from(blob: bytes, record_id: int, chunk: int = 64) -> Iterator[list[RawEntry]]:
    """The dump's entries from the one with `record_id` on (all of them when it is absent), in
    lists of at most `chunk` decoded entries. Yields nothing for a dump without entries. The
    caller offers the GIL to other threads between lists (``time.sleep(0)``)."""
    start = blob.find(_ENTRIES)
    if start < 0:
        return
    begin = start + len(_ENTRIES)
    if blob[begin : begin + 1] == b"]":
        return
    end = blob.find(_END, begin)
    if end < 0:
        return
    position = _first_needed(blob, begin, end, record_id)
    while position <= end:
        stop = position
        for _ in range(chunk):
            found = blob.find(_SEPARATOR, stop, end)
            if found < 0:
                stop = end
                break
            stop = found + 1
        if stop == end:
            piece = blob[position : end + 1]
            position = end + 1
        else:
            piece = blob[position:stop]
            position = stop + 1
        yield _decode(b"[" + piece + b"]")
