"""The I/O edge of the analysis core: read a Kineto trace file (``.json`` or ``.json.gz``).

This is the one module of `mfuscope.core.trace` that touches the file system. Two readers:
- `read_trace`: the fast path (the CLI's): decodes straight into the engine's event model
  (`KinetoTrace`, msgspec Structs holding only the fields the analysis reads); in two halves,
  `scan_trace` (read, gunzip, select: no numpy) then `decode_scanned`;
- `load_trace`: the whole document as plain JSON (dicts and lists), for tools and tests that
  look at other fields; `analyze_trace` accepts it too (converting it first).
"""

from __future__ import annotations

import contextlib
import gc
import importlib
import json
import os
import stat
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, NamedTuple, Protocol, cast

import msgspec
from mfuscope.core.errors import TraceError
from mfuscope.core.trace._events import KinetoTrace, decode_kineto, describe_validation_error
from mfuscope.core.trace._select import ScannedDocument, scan_events, selection_of

__all__ = [
    "DEFAULT_MAX_TRACE_BYTES",
    "KinetoTrace",
    "ScannedTrace",
    "decode_scanned",
    "find_trace_files",
    "gc_paused",
    "load_trace",
    "read_trace",
    "scan_trace",
]

_GZIP_MAGIC = b"\x1f\x8b"
# The largest trace (after gzip decoding) read by default: decoding takes several times this in
# memory, so a small .json.gz that inflates to gigabytes is refused instead of exhausting it
# (docs/analyze.md; `mfuscope analyze --max-trace-bytes` raises it).
DEFAULT_MAX_TRACE_BYTES = 2 << 30


class _Inflater(Protocol):
    eof: bool
    unused_data: bytes

    def decompress(self, data: bytes, max_length: int = ...) -> bytes: ...


def _gunzip() -> tuple[Callable[..., _Inflater], tuple[type[Exception], ...]]:
    """ISA-L's inflate where its wheel installs (faster than zlib's: benchmarks/RESULTS.md#reading),
    else the standard library's; with the errors each raises on bad data."""
    errors: tuple[type[Exception], ...] = (EOFError, OSError, zlib.error)
    try:
        isal_zlib = importlib.import_module("isal.isal_zlib")
    except ImportError:
        return cast(Callable[..., _Inflater], zlib.decompressobj), errors
    return cast(Callable[..., _Inflater], isal_zlib.decompressobj), (*errors, isal_zlib.error)


_decompressobj, _GZIP_ERRORS = _gunzip()


def _inflate(path: Path, raw: bytes, max_bytes: int) -> bytes:
    """Every gzip member of `raw`, inflated, at most `max_bytes` in all (else `TraceError`)."""
    parts: list[bytes] = []
    total = 0
    while True:
        inflater = _decompressobj(wbits=31)  # gzip container
        try:
            part = inflater.decompress(raw, max_bytes - total + 1)
        except _GZIP_ERRORS as exc:
            raise TraceError(path, f"corrupt or truncated gzip data ({exc})") from None
        total += len(part)
        if total > max_bytes:
            raise TraceError(
                path,
                f"inflates to more than {max_bytes} bytes (raise the limit with "
                "--max-trace-bytes if this trace is genuine)",
            )
        if not inflater.eof:
            raise TraceError(path, "corrupt or truncated gzip data (stream ends early)")
        parts.append(part)
        raw = inflater.unused_data
        if not raw.startswith(_GZIP_MAGIC):  # another member follows, or trailing padding
            break
    if raw.strip(b"\0"):
        raise TraceError(path, "corrupt gzip data (garbage after the last member)")
    return parts[0] if len(parts) == 1 else b"".join(parts)


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """Pause the cyclic GC: decoding builds up to millions of small objects, none of them
    garbage yet, and every collection meanwhile would walk them all again (figures:
    benchmarks/RESULTS.md#reading)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


_TRACE_SUFFIXES = (".json", ".json.gz")


def _read_bytes(path: Path, max_bytes: int = DEFAULT_MAX_TRACE_BYTES) -> bytes:
    try:
        # O_NONBLOCK: opening a FIFO must not wait for a writer; the mode check then refuses it.
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except FileNotFoundError:
        raise TraceError(path, "no such file") from None
    except IsADirectoryError:
        raise TraceError(path, "is a directory, not a trace file") from None
    except OSError as exc:
        raise TraceError(path, f"cannot read: {exc.strerror or exc}") from None
    with open(fd, "rb") as handle:
        status = os.fstat(fd)
        mode = status.st_mode
        if stat.S_ISDIR(mode):
            raise TraceError(path, "is a directory, not a trace file")
        if not stat.S_ISREG(mode):
            raise TraceError(path, "not a regular file (a FIFO, socket or device)")
        if status.st_size > max_bytes:
            raise TraceError(
                path,
                f"larger than {max_bytes} bytes (raise the limit with --max-trace-bytes "
                "if this trace is genuine)",
            )
        try:
            raw = handle.read()
        except OSError as exc:
            raise TraceError(path, f"cannot read: {exc.strerror or exc}") from None
    if raw[:2] == _GZIP_MAGIC:  # by content, not by name: some tools gzip without renaming
        raw = _inflate(path, raw, max_bytes)
    return raw


def load_trace(
    path: str | os.PathLike[str], *, max_bytes: int = DEFAULT_MAX_TRACE_BYTES
) -> dict[str, Any]:
    """Read and decode one Kineto chrome trace; gzip is detected by its magic bytes.

    Raises `TraceError(path, message)` for a missing file, bad gzip, text that is not JSON,
    or JSON that is not a Kineto trace (an object with a ``traceEvents`` list).
    """
    file = Path(path)
    raw = _read_bytes(file, max_bytes)
    try:
        with gc_paused():
            trace = json.loads(raw)
    except UnicodeDecodeError as exc:
        raise TraceError(file, f"not JSON text ({exc.reason})") from None
    except ValueError as exc:
        raise TraceError(file, f"not JSON ({exc})") from None
    except RecursionError:
        raise TraceError(file, "not a Kineto trace: JSON nested too deeply") from None
    if not isinstance(trace, dict) or not isinstance(trace.get("traceEvents"), list):
        raise TraceError(file, "not a Kineto trace: no top-level traceEvents list")
    return trace


def read_trace(
    path: str | os.PathLike[str], *, max_bytes: int = DEFAULT_MAX_TRACE_BYTES
) -> KinetoTrace:
    """Read and decode one Kineto chrome trace into the engine's event model (fast path).

    Gzip is detected by its magic bytes. Events the analysis never reads are left out before
    decoding (`_select`), and keys it does not read are skipped by the decoder. Raises
    `TraceError(path, message)` for a missing file, bad gzip, text that is not JSON, JSON that
    is not a Kineto trace, an event field of the wrong type, or an impossible timing (a negative
    or absurd ``ts``/``dur``, `_timings`). `max_bytes` bounds the file and its gzip-decoded size.
    """
    return decode_scanned(scan_trace(path, max_bytes=max_bytes))


class ScannedTrace(NamedTuple):
    """A trace file read, gunzipped and scanned (`_select`), not decoded yet."""

    path: Path
    raw: bytes
    scanned: ScannedDocument


def scan_trace(
    path: str | os.PathLike[str], *, max_bytes: int = DEFAULT_MAX_TRACE_BYTES
) -> ScannedTrace:
    """`read_trace`'s first half: read, gunzip and scan; `TraceError` for a file that cannot
    be read or a gzip stream that cannot be inflated. Imports no numpy, and the gunzip and the
    scan run without the GIL: `mfuscope analyze` runs this while numpy loads on a thread."""
    file = Path(path)
    raw = _read_bytes(file, max_bytes)
    return ScannedTrace(file, raw, scan_events(raw))


def decode_scanned(scanned: ScannedTrace) -> KinetoTrace:
    """`read_trace`'s second half: decode what the scan kept, attach its columns, check the
    timings (the errors of `read_trace`). Imports numpy (the columns, `_timings`)."""
    from mfuscope.core.trace._timings import check_timings  # numpy: not in scan_trace

    file = scanned.path
    try:
        with gc_paused():
            trace = _decode_selected(scanned.raw, scanned.scanned)
    except msgspec.ValidationError as exc:
        raise TraceError(file, describe_validation_error(exc)) from None
    except msgspec.DecodeError as exc:
        raise TraceError(file, f"not JSON ({exc})") from None
    except UnicodeDecodeError as exc:  # msgspec checks UTF-8 only in the strings it decodes
        raise TraceError(file, f"not JSON text ({exc.reason})") from None
    except RecursionError:
        raise TraceError(file, "not a Kineto trace: JSON nested too deeply") from None
    problem = check_timings(trace)
    if problem is not None:
        raise TraceError(file, problem)
    return trace


def _decode_selected(raw: bytes, scanned: ScannedDocument) -> KinetoTrace:
    """Decode what the selection keeps of `raw`, with the columns it read."""
    selection = selection_of(scanned)
    if selection.document is None:
        trace = decode_kineto(raw)
    else:
        try:
            trace = decode_kineto(selection.document)
        except msgspec.DecodeError:
            # Decode the file itself: its error names the file's own event index (and its
            # events are not the ones the columns describe).
            return decode_kineto(raw)
    if selection.columns is None:
        return trace
    return msgspec.structs.replace(trace, columns=selection.columns)


def find_trace_files(path: str | os.PathLike[str]) -> list[Path]:
    """`path` itself if it is a file, else the ``*.json`` / ``*.json.gz`` files under it, in
    its subdirectories too (as `mfuscope report` looks), sorted."""
    root = Path(path)
    if not root.is_dir():
        return [root]
    files = sorted(p for p in root.rglob("*") if p.name.endswith(_TRACE_SUFFIXES) and p.is_file())
    if not files:
        raise TraceError(root, "directory holds no .json or .json.gz trace, nor do its subfolders")
    return files
