"""`read_trace` (the fast msgspec path) against `load_trace` (plain JSON): same errors, same
answers, on synthetic and real traces."""

from __future__ import annotations

import gzip
import json
import sys
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from mfuscope.core.trace import (
    AnalysisOptions,
    KinetoTrace,
    TraceError,
    analyze_trace,
    load_trace,
    read_trace,
    trace_io,
)
from mfuscope.core.trace._events import decode_kineto

from tests.support.shared_data import A100_TRACE, MI300X_TRACE, real_trace_params, require
from tests.support.trace_builder import GLOO_TIDS, Group, TraceBuilder

REAL = real_trace_params([A100_TRACE, MI300X_TRACE])


def _gpu_trace() -> dict[str, Any]:
    b = TraceBuilder(world_size=2, groups=(Group("0", "default_pg", (0, 1)),))
    b.profiler_step(1, 0.0, 10.0)
    b.profiler_step(2, 10.0, 20.0)
    b.kernel(20.0, 50.0, launch_at=1.0)
    b.memcpy(75.0, 5.0, launch_at=2.0)
    b.comm_kernel(60.0, 20.0, launch_at=3.0, nelems=1000, metadata="rpc")
    b.kernel(100.0, 10.0, launch_at=12.0)
    b.comm_kernel(105.0, 20.0, launch_at=13.0, nelems=500)
    return b.build()


def _gloo_trace() -> dict[str, Any]:
    b = TraceBuilder(gpu=False, world_size=2)
    b.thread_name(GLOO_TIDS[0], "pt_gloo_runloop")
    b.profiler_step(1, 0.0, 100.0)
    b.cpu_op("aten::linear", 5.0, 25.0)
    b.cpu_op("c10d::allreduce_", 40.0, 50.0)
    b.gloo("all_reduce", 45.0, 30.0, nelems=1000)
    return b.build()


def _write(path: Path, trace: dict[str, Any]) -> Path:
    path.write_text(json.dumps(trace))
    return path


@pytest.mark.parametrize("build", [_gpu_trace, _gloo_trace])
def test_fast_and_plain_paths_agree_on_synthetic_traces(tmp_path: Path, build: Any) -> None:
    path = _write(tmp_path / "t.json", build())
    fast = read_trace(path)
    assert isinstance(fast, KinetoTrace)
    options = AnalysisOptions(gpus_per_node=1)
    expected = analyze_trace(load_trace(path), options)
    assert analyze_trace(fast, options) == expected
    assert analyze_trace(build(), options) == expected  # the dict built in memory
    assert expected.steps and expected.steps[0].collectives


@pytest.mark.parametrize("path", REAL)
def test_fast_and_plain_paths_agree_on_real_traces(path: Path) -> None:
    require(path)
    assert analyze_trace(read_trace(path)) == analyze_trace(load_trace(path))


def test_unknown_category_and_phase_fall_back_to_plain_strings(tmp_path: Path) -> None:
    trace = _gpu_trace()
    expected = analyze_trace(trace)
    trace["traceEvents"].append({"ph": "X", "cat": "brand_new_category", "name": "x", "ts": 1.0})
    trace["traceEvents"].append({"ph": "?", "cat": "user_annotation", "name": "odd", "ts": 2.0})
    path = _write(tmp_path / "t.json", trace)
    decoded = decode_kineto(path.read_bytes())  # every event, no selection
    assert "brand_new_category" in {e.cat for e in decoded.events}
    assert "?" in {e.ph for e in decoded.events}
    fast = read_trace(path)  # the unread category is left out before decoding; the phase is not
    assert "?" in {e.ph for e in fast.events}
    assert analyze_trace(fast) == analyze_trace(decoded) == expected


# Both readers word every error the same way; the fast reader also checks event field types.
COMMON_ERRORS = [
    (None, "no such file"),
    (b"", "not JSON"),
    (b"\xff\xfe{", "not JSON"),
    (b'{"traceEvents": [', "not JSON"),
    (b"[1, 2]", "not a Kineto trace"),
    (b'{"traceEvents": 3}', "not a Kineto trace"),
    (gzip.compress(b'{"traceEvents": []}', mtime=0)[:-8], "truncated gzip"),
]
READ_ONLY_ERRORS = [
    (b'{"other": []}', "not a Kineto trace"),
    (b'{"traceEvents": [{"ph": "X", "cat": "cpu_op", "name": "\xff"}]}', "not JSON text"),
    (b'{"traceEvents": [{"ph": "X", "ts": "soon"}]}', "malformed trace event"),
]


@pytest.mark.parametrize(
    ("reader", "content", "message"),
    [(load_trace, *case) for case in COMMON_ERRORS]
    + [(read_trace, *case) for case in COMMON_ERRORS + READ_ONLY_ERRORS],
)
def test_reader_errors_name_the_file(
    tmp_path: Path, reader: Callable[[Path], object], content: bytes | None, message: str
) -> None:
    path = tmp_path / "t.json.gz"
    if content is not None:
        path.write_bytes(content)
    with pytest.raises(TraceError, match=message) as info:
        reader(path)
    assert info.value.path == str(path)


def test_wrongly_typed_event_in_a_dict_is_a_malformed_trace() -> None:
    trace = _gpu_trace()
    trace["traceEvents"].append({"ph": "X", "cat": "kernel", "ts": "soon", "dur": 1.0})
    with pytest.raises(TraceError, match="malformed trace event") as info:
        analyze_trace(trace)
    assert info.value.path is None


def test_gunzip_falls_back_to_the_standard_library_without_isal(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    data = gzip.compress(b'{"traceEvents": []}', mtime=0)
    fast, fast_errors = trace_io._gunzip()
    monkeypatch.setitem(sys.modules, "isal.isal_zlib", None)  # import fails as if not installed
    plain, plain_errors = trace_io._gunzip()
    assert plain is zlib.decompressobj and fast is not zlib.decompressobj
    for make in (fast, plain):
        inflater = make(wbits=31)
        assert inflater.decompress(data) == b'{"traceEvents": []}' and inflater.eof
    for make, errors in ((fast, fast_errors), (plain, plain_errors)):
        with pytest.raises(errors):
            make(wbits=31).decompress(data[:10] + b"\xff" * 20)
