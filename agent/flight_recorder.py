"""Access to PyTorch's c10d flight recorder: turning it on, and dumping it off the training thread.

Turning it on. The recorder is one ring buffer per process whose size PyTorch reads from
``TORCH_FR_BUFFER_SIZE`` (older name ``TORCH_NCCL_TRACE_BUFFER_SIZE``) once, when the first
process group is created (checked on torch 2.13: setting it after ``init_process_group`` has no
effect). PyTorch 2.13 records 2,000 entries by default; older releases record none unless told.
So `enable_flight_recorder` sets ``TORCH_FR_BUFFER_SIZE=2000`` when neither variable is set, and
`mfuscope.agent` calls it when it is imported: a script that imports the agent before it creates
its process group gets the recorder on any torch. A value the user set (``0`` turns it off) is
left alone. On NCCL the recorder's durations need start events: `enable_nccl_timing` turns them on
for the groups that exist (``ProcessGroup._enable_collectives_timing``, what
``TORCH_NCCL_ENABLE_TIMING=1`` does at creation). PyTorch warns that timing adds a CUDA event
query to its watchdog, which can make a watchdog hang likelier (``ProcessGroupNCCL.hpp``), and it
adds an event record per collective: the agent's ``collective_timing=False`` leaves it off.

Dumping. Each dump returns the whole ring. The Python bindings (``_dump_fr_trace``,
``_dump_nccl_trace`` and their ``_json`` forms) hold the GIL for the whole dump, a stall of the
training thread whenever it wants the GIL meanwhile (figures: benchmarks/RESULTS.md). On Linux
x86-64 the agent calls the same C++ functions, ``c10d::dump_fr_trace_json`` and
``c10d::dump_nccl_trace_json``, through ctypes, which releases the GIL for the dump itself;
decoding the returned JSON on the periodic thread still holds it, for a time that grows with the
ring's entries. The result (a ``std::string``
returned by value: a hidden result pointer in the first argument register under the x86-64 System
V ABI) is copied out and freed with ``operator delete``. The native path is checked once against
the binding before use (identical output for a dump without entries); anywhere else, or when the
check fails, the agent uses the pickle binding.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import pickle
import platform
import sys
from collections.abc import Callable, MutableMapping
from dataclasses import dataclass
from typing import Any

__all__ = [
    "BUFFER_SIZE_VARIABLES",
    "DumpSource",
    "dump_sources",
    "enable_flight_recorder",
    "enable_nccl_timing",
    "nccl_group_count",
    "ring_entries",
]

BUFFER_SIZE_VARIABLES = ("TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE")
DEFAULT_BUFFER_SIZE = 2000  # entries; PyTorch 2.13's own default
# std::string under the libstdc++ C++11 ABI: data pointer, length, then a 16-byte local buffer
# (used for strings of up to 15 characters) or the capacity.
_STD_STRING_BYTES = 32
_LOCAL_BUFFER_OFFSET = 16


def enable_flight_recorder(environ: MutableMapping[str, str] | None = None) -> bool:
    """Ask PyTorch for a flight recorder of `DEFAULT_BUFFER_SIZE` entries, unless the user chose
    a size. Effective only before the process's first process group exists. Returns whether it
    set the variable."""
    env = os.environ if environ is None else environ
    if any(name in env for name in BUFFER_SIZE_VARIABLES):
        return False
    env[BUFFER_SIZE_VARIABLES[0]] = str(DEFAULT_BUFFER_SIZE)
    return True


def ring_entries(environ: MutableMapping[str, str] | None = None) -> int:
    """The ring's size as PyTorch reads it (the first of `BUFFER_SIZE_VARIABLES` that is set)."""
    env = os.environ if environ is None else environ
    for name in BUFFER_SIZE_VARIABLES:
        if name in env:
            try:
                return max(int(env[name]), 0)
            except ValueError:
                return DEFAULT_BUFFER_SIZE
    return DEFAULT_BUFFER_SIZE


def _nccl_groups() -> list[Any]:
    """The existing process groups with an NCCL backend."""
    import torch
    from torch.distributed import distributed_c10d as c10d

    found = []
    for pg in list(c10d._world.pg_group_ranks):
        try:
            backend = pg._get_backend(torch.device("cuda"))
        except Exception:  # no CUDA backend on this group
            continue
        if type(backend).__name__ == "ProcessGroupNCCL":
            found.append(pg)
    return found


def nccl_group_count() -> int:
    """How many existing process groups have an NCCL backend."""
    return len(_nccl_groups())


def enable_nccl_timing() -> int:
    """Turn on collective timing for every existing NCCL process group; returns how many."""
    groups = _nccl_groups()
    for pg in groups:
        pg._enable_collectives_timing()
    return len(groups)


@dataclass(frozen=True)
class DumpSource:
    """One recorder and how to dump it. `json` is True when `dump` returns the JSON dump (bytes),
    False when it returns the decoded pickle dump (a dict). `native`: the GIL is released."""

    name: str
    dump: Callable[[], Any]
    json: bool
    native: bool


class _NativeDump:
    """A ``std::string f(bool includeCollectives, bool onlyActive)`` of libtorch, via ctypes."""

    def __init__(self, library: str, symbol: str) -> None:
        lib = ctypes.CDLL(library)
        self._fn = getattr(lib, symbol)
        self._fn.restype = None
        self._fn.argtypes = [ctypes.c_void_p, ctypes.c_bool, ctypes.c_bool]
        libstdcxx = ctypes.CDLL("libstdc++.so.6")
        self._delete = libstdcxx._ZdlPv  # operator delete(void*)
        self._delete.restype = None
        self._delete.argtypes = [ctypes.c_void_p]

    def __call__(self, include_collectives: bool = True) -> bytes:
        result = ctypes.create_string_buffer(_STD_STRING_BYTES)
        address = ctypes.addressof(result)
        self._fn(address, include_collectives, False)  # ctypes releases the GIL here
        data = ctypes.c_void_p.from_address(address).value or 0
        size = ctypes.c_size_t.from_address(address + 8).value
        try:
            return ctypes.string_at(data, size) if size else b""
        finally:
            if data and data != address + _LOCAL_BUFFER_OFFSET:
                self._delete(data)


# (source name, shared library, C++ symbol, JSON binding, pickle binding)
_SOURCES = (
    (
        "generic",
        "libtorch_cpu.so",
        "_ZN4c10d18dump_fr_trace_jsonB5cxx11Ebb",
        "_dump_fr_trace_json",
        "_dump_fr_trace",
    ),
    (
        "nccl",
        "libtorch_cuda.so",
        "_ZN4c10d20dump_nccl_trace_jsonB5cxx11Ebb",
        "_dump_nccl_trace_json",
        "_dump_nccl_trace",
    ),
)


def _native_allowed() -> bool:
    return sys.platform == "linux" and platform.machine() in ("x86_64", "AMD64")


def _checked_native(library: str, symbol: str, binding: Callable[..., Any]) -> _NativeDump | None:
    """The native dump when its output matches the binding's (a dump without entries)."""
    if not _native_allowed() or not os.path.exists(library):
        return None
    try:
        native = _NativeDump(library, symbol)
        import json

        mine = json.loads(native(False))
        theirs = json.loads(binding(False, False))
        return native if mine == theirs and isinstance(mine, dict) else None
    except Exception:  # a missing symbol or a surprise: the binding it is
        return None


def dump_sources(allow_native: bool = True) -> list[DumpSource]:
    """The recorders this torch build has, each with its cheapest safe dump."""
    import torch
    import torch._C._distributed_c10d as c10d

    lib_dir = os.path.join(os.path.dirname(torch.__file__), "lib")
    sources = []
    for name, library, symbol, json_binding, pickle_binding in _SOURCES:
        json_fn = getattr(c10d, json_binding, None)
        pickle_fn = getattr(c10d, pickle_binding, None)
        native = None
        if allow_native and json_fn is not None:
            native = _checked_native(os.path.join(lib_dir, library), symbol, json_fn)
        if native is not None:
            sources.append(DumpSource(name, native, json=True, native=True))
        elif pickle_fn is not None:
            sources.append(
                DumpSource(name, _pickled(pickle_fn), json=False, native=False)  # holds the GIL
            )
    return sources


def _pickled(binding: Callable[..., bytes]) -> Callable[[], Any]:
    def dump() -> Any:
        with contextlib.suppress(pickle.UnpicklingError):
            return pickle.loads(binding(True, False, False))  # no stack traces: cheaper
        return {}

    return dump
