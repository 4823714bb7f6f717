"""The I/O edge of the analysis core: read a Kineto trace file (``.json`` or ``.json.gz``).

This is the one module of `mfuscope.core.trace` that touches the file system. Two readers:
- `read_trace`: the fast path (the CLI's): decodes straight into the engine's event model
  (`KinetoTrace`, msgspec Structs holding only the fields the analysis reads);
- `load_trace`: the whole document as plain JSON (dicts and lists), for tools and tests that
  look at other fields; `analyze_trace` accepts it too (converting it first).
"""

from __future__ import annotations

import contextlib
import gc
import gzip
import importlib
import json
import os
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, cast

import msgspec
from mfuscope.core.errors import TraceError
from mfuscope.core.trace._events import KinetoTrace, decode_kineto, describe_validation_error
from mfuscope.core.trace._select import select_events

__all__ = [
    "KinetoTrace",
    "find_trace_files",
    "gc_paused",
    "load_trace",
    "read_trace",
]

_GZIP_MAGIC = b"\x1f\x8b"


def _gunzip() -> tuple[Callable[[bytes], bytes], tuple[type[Exception], ...]]:
    """ISA-L's inflate where its wheel installs (~1.6x faster than zlib's on these traces,
    docs/analyze.md), else the standard library's; with the errors each raises on bad data."""
    errors: tuple[type[Exception], ...] = (EOFError, OSError, zlib.error)
    try:
        igzip = importlib.import_module("isal.igzip")
        isal_zlib = importlib.import_module("isal.isal_zlib")
    except ImportError:
        return gzip.decompress, errors
    return cast(Callable[[bytes], bytes], igzip.decompress), (*errors, isal_zlib.error)


_decompress, _GZIP_ERRORS = _gunzip()


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """Pause the cyclic GC: decoding builds up to millions of small objects, none of them
    garbage yet, and every collection meanwhile would walk them all again (measured: up to 2x
    on a 2M-event trace)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


_TRACE_SUFFIXES = (".json", ".json.gz")


def _read_bytes(path: Path) -> bytes:
    try:
        with path.open("rb") as handle:
            raw = handle.read()
    except FileNotFoundError:
        raise TraceError(path, "no such file") from None
    except IsADirectoryError:
        raise TraceError(path, "is a directory, not a trace file") from None
    except OSError as exc:
        raise TraceError(path, f"cannot read: {exc.strerror or exc}") from None
    if raw[:2] == _GZIP_MAGIC:  # by content, not by name: some tools gzip without renaming
        try:
            raw = _decompress(raw)
        except _GZIP_ERRORS as exc:
            raise TraceError(path, f"corrupt or truncated gzip data ({exc})") from None
    return raw


def load_trace(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Read and decode one Kineto chrome trace; gzip is detected by its magic bytes.

    Raises `TraceError(path, message)` for a missing file, bad gzip, text that is not JSON,
    or JSON that is not a Kineto trace (an object with a ``traceEvents`` list).
    """
    file = Path(path)
    raw = _read_bytes(file)
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


def read_trace(path: str | os.PathLike[str]) -> KinetoTrace:
    """Read and decode one Kineto chrome trace into the engine's event model (fast path).

    Gzip is detected by its magic bytes. Events the analysis never reads are left out before
    decoding (`_select`), and keys it does not read are skipped by the decoder. Raises
    `TraceError(path, message)` for a missing file, bad gzip, text that is not JSON, JSON that
    is not a Kineto trace, or an event field of the wrong type.
    """
    file = Path(path)
    raw = _read_bytes(file)
    try:
        with gc_paused():
            return _decode_selected(raw)
    except msgspec.ValidationError as exc:
        raise TraceError(file, describe_validation_error(exc)) from None
    except msgspec.DecodeError as exc:
        raise TraceError(file, f"not JSON ({exc})") from None
    except UnicodeDecodeError as exc:  # msgspec checks UTF-8 only in the strings it decodes
        raise TraceError(file, f"not JSON text ({exc.reason})") from None
    except RecursionError:
        raise TraceError(file, "not a Kineto trace: JSON nested too deeply") from None


def _decode_selected(raw: bytes) -> KinetoTrace:
    """Decode what the selection keeps of `raw`, with the columns it read."""
    selection = select_events(raw)
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
    """`path` itself if it is a file, else the ``*.json`` / ``*.json.gz`` files in it, sorted."""
    root = Path(path)
    if not root.is_dir():
        return [root]
    files = sorted(p for p in root.iterdir() if p.is_file() and p.name.endswith(_TRACE_SUFFIXES))
    if not files:
        raise TraceError(root, "directory holds no .json or .json.gz trace")
    return files
