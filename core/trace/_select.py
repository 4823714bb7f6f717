"""Leave out, before decoding, the trace events the analysis never reads.

Most events of a GPU trace are never looked at past their category: flow arrows (``ac2g``,
``fwdbwd``), host operators other than the few named below, the Python calls of a
``with_stack`` profile, and the runtime calls that launch nothing on the device (event
records, synchronisations, ...). Decoding them is most of the cost of reading a trace, and
freeing them costs again (figures: benchmarks/RESULTS.md#reading), so the C scanner
``_select_c`` copies the document without them; only then is it decoded. An event is left out
only when its ``cat`` is a plain string and:
- the category is one the analysis does not read at all (see `_scan`);
- it is a host operator whose name starts with none of the names the GPU path reads, and the
  trace has device events (on a host-only trace every operator is compute, so all are kept);
- it is a Python call whose name holds none of the substrings recomputation is found by;
- it is a runtime call whose integer ``args.correlation`` no device event names (runtime
  calls are read only as the launch of a device event: `_kineto`). If any event that is or
  may be a device event has a correlation that is not a plain integer, every runtime call
  stays.
Anything unusual (no or a non-string category, escapes in a key, category or name, a repeated
key) keeps the event, and the scanner checks that every event it leaves out is JSON the decoder
takes (UTF-8, paired surrogates, numbers a double holds).

The rules are assembled here from the modules that read the events, so a reader that starts
reading a new name must list it there; `tests/unit/core/trace/test_select.py` checks that
analysing the selected document gives exactly the result of analysing the whole one.

On the way it reads the few numbers the timeline needs of every device event and launch
(`_columns`), when it can read them with certainty, and each kernel's name as a position in
the list of distinct names (for its kernel class, `kernel_classes`). Then ("lean") the
document also leaves out every kernel whose name holds none of
`_kineto.COMM_KERNEL_SUBSTRINGS` (ASCII case ignored; a name that is not ASCII stays), every
memory op, and the launches only those name: they are in the columns alone, and the analysis
of such a document needs its columns (`read_trace` attaches them).

The scan runs without the GIL, and arrays of 4 MB or more are scanned in two halves on two
threads. `scan_events` imports no numpy (the columns are turned into arrays by
`selection_of`), so `mfuscope analyze` scans its first trace while numpy loads. Without the
compiled scanner (no C compiler at install time) nothing is selected and the whole document is
decoded: the same results, only slower (what the scanner buys, `benchmarks/analyze_bench.py
--tricks`: benchmarks/RESULTS.md#whole-process-and-start-up).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, NamedTuple, cast

import msgspec
from mfuscope.core.trace import _read_names, _scan, _steps

if TYPE_CHECKING:
    from mfuscope.core.trace._columns import DeviceColumns

__all__ = [
    "SELECTION_AVAILABLE",
    "ScannedDocument",
    "Selection",
    "scan_events",
    "select_events",
    "selection_of",
]


_Columns = tuple[bytes, list[str | None]]  # the records and the distinct kernel names


def _compiled() -> Callable[..., tuple[bytes | None, _Columns | None]] | None:
    try:
        module = importlib.import_module("mfuscope.core.trace._select_c")
    except ImportError:  # built without a C compiler: decode everything
        return None
    return cast(Callable[..., "tuple[bytes | None, _Columns | None]"], module.select_events)


_select_c = _compiled()
SELECTION_AVAILABLE = _select_c is not None


def _encoded(texts: Iterable[str]) -> tuple[bytes, ...]:
    return tuple(text.encode() for text in texts)


_RULES = (
    # kept whatever their name
    _encoded(
        (
            *_scan.KERNEL_CATEGORIES,
            *_scan.MEMOP_CATEGORIES,
            *_scan.ANNOTATION_CATEGORIES,
            *_scan.DEVICE_ANNOTATION_CATEGORIES,
            *_scan.UNREAD_DEVICE_CATEGORIES,
        )
    ),
    # device events (kernels, then memory ops): their presence makes a device trace
    # (`decompose.build_timeline` picks the GPU path), their correlation ids the launches that
    # are kept; they and the launches get columns (`_columns`)
    _encoded(_scan.KERNEL_CATEGORIES),
    _encoded(_scan.MEMOP_CATEGORIES),
    # host launches: read only through a device event's correlation id (`_kineto`)
    _encoded(_scan.RUNTIME_CATEGORIES),
    # host operators: kept by name prefix on device traces
    _encoded(_scan.OPERATOR_CATEGORIES),
    _encoded(
        (
            *_steps.OPERATOR_PREFIXES,
            *_read_names.TIMELINE_OPERATOR_PREFIXES,
            *_read_names.RECOMPUTE_OPERATOR_PREFIXES,
        )
    ),
    # Python calls: kept by name substring
    _encoded(_scan.PYTHON_CATEGORIES),
    _encoded(_read_names.RECOMPUTE_PYTHON_SUBSTRINGS),
    # kernels read decoded (communication: `_kineto.is_comm_kernel`); with columns, others not
    _encoded(_read_names.COMM_KERNEL_SUBSTRINGS),
)


class Selection(msgspec.Struct, frozen=True):
    """`document`: `raw` without the events left out (None: decode `raw` itself); `columns`:
    the device events' and launches' numbers (None: read them from the decoded events)."""

    document: bytes | None
    columns: DeviceColumns | None


class ScannedDocument(NamedTuple):
    """What the scanner gives, before any numpy: `document` as in `Selection`, `records` the
    columns' packed records and distinct kernel names (None: no columns). A NamedTuple: a
    frozen dataclass costs ~0.7 ms to create at import (its generated methods are compiled)."""

    document: bytes | None
    records: _Columns | None


def scan_events(raw: bytes) -> ScannedDocument:
    """What of `raw` to decode, and the columns' records read on the way (module docstring)."""
    if _select_c is None:
        return ScannedDocument(None, None)
    document, read = _select_c(raw, *_RULES)
    return ScannedDocument(document, read)


def selection_of(scanned: ScannedDocument) -> Selection:
    """The selection with its columns as arrays (this imports numpy)."""
    from mfuscope.core.trace._columns import DeviceColumns  # numpy: not in scan_events

    records = scanned.records
    columns = None if records is None else DeviceColumns.from_records(*records)
    return Selection(scanned.document, columns)


def select_events(raw: bytes) -> Selection:
    """What of `raw` to decode, and the columns read on the way (see the module docstring)."""
    return selection_of(scan_events(raw))
