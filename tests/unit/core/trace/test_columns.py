"""The device columns the C selection reads (`_columns`): exactly the decoded events' values,
or none at all, and the same analysis either way."""

from __future__ import annotations

import gzip
import json
import random
import struct
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from mfuscope.core.trace import AnalysisOptions, TraceError, analyze_trace, read_trace
from mfuscope.core.trace._columns import DeviceColumns, EventColumns, LaunchIndex
from mfuscope.core.trace._events import KinetoTrace, decode_kineto
from mfuscope.core.trace._kineto import is_comm_kernel
from mfuscope.core.trace._scan import Event, scan_events
from mfuscope.core.trace._select import select_events
from msgspec.structs import replace

from tests.support.shared_data import real_trace_params, require
from tests.support.trace_builder import TraceBuilder, realistic_trace
from tests.support.trace_strategies import synthetic

pytestmark = pytest.mark.usefixtures("scan_mode")  # every test with both scans


def read(raw: bytes) -> KinetoTrace:
    """What `read_trace` does with `raw`: the selected document, decoded, with its columns."""
    selection = select_events(raw)
    trace = decode_kineto(selection.document if selection.document is not None else raw)
    return msgspec.structs.replace(trace, columns=selection.columns)


def bits(values: Any) -> list[bytes]:
    return [struct.pack("<d", v) for v in values]


def fields(event: Event) -> tuple[Any, ...]:
    """An event's values, whichever of the decoder's two event models it came in: the whole
    document may need the plain one (an event without "ph") where the selection does not."""
    return (event.cat, event.ph, event.name, event.pid, event.tid, event.ts, event.dur, event.args)


def check_columns_match_events(raw: bytes) -> KinetoTrace:
    """The columns of `raw` against its events decoded in full: every kernel and memory op,
    every launch that has no id or whose id a device event names; the rows marked decoded
    are the events left in the selected document, communication kernels among them."""
    trace = read(raw)
    columns = trace.columns
    assert isinstance(columns, DeviceColumns)
    whole = scan_events(decode_kineto(raw).events)
    named = {e.args.correlation for e in [*whole.kernels, *whole.memops] if e.args is not None}
    launches = [e for e in whole.runtime if e.args is None or e.args.correlation in named]
    selected = scan_events(trace.events)

    def compare(events: list[Event], column: EventColumns, decoded: list[Event]) -> None:
        assert len(column) == len(events)
        assert bits(column.ts.tolist()) == bits(e.ts for e in events)  # bit for bit
        present = [e.args is not None and e.args.correlation is not None for e in events]
        assert column.has_correlation.tolist() == present
        ids = [e.args.correlation for e, p in zip(events, present, strict=True) if p]
        assert column.correlation[column.has_correlation].tolist() == ids
        rows = np.flatnonzero(column.decoded).tolist()
        assert [fields(events[i]) for i in rows] == list(map(fields, decoded))

    compare(whole.kernels, columns.kernels, selected.kernels)
    compare(whole.memops, columns.memops, selected.memops)
    compare(launches, columns.launches, selected.runtime)
    for events, column in ((whole.kernels, columns.kernels), (whole.memops, columns.memops)):
        assert bits(column.dur.tolist()) == bits(e.dur for e in events)
        assert column.pid.tolist() == [e.pid for e in events]
    assert columns.launches.tid.tolist() == [e.tid for e in launches]
    # Only communication kernels are decoded, and those whose names the scanner does not read
    # plainly (escaped, or not ASCII): it keeps them, to be safe.
    plain = b"\\" not in raw
    for decoded, event in zip(columns.kernels.decoded.tolist(), whole.kernels, strict=True):
        assert decoded == is_comm_kernel(event.name) or (
            decoded and not (plain and event.name.isascii())
        )
    return trace


def analysis(trace: KinetoTrace) -> Any:
    """The analysis of `trace` (gpus_per_node=4), or its error message."""
    try:
        return analyze_trace(trace, AnalysisOptions(gpus_per_node=4))
    except TraceError as exc:
        return exc.message


@pytest.mark.parametrize("path", real_trace_params())
def test_real_traces_get_columns_equal_to_their_events(path: Path) -> None:
    raw = gzip.decompress(require(path).read_bytes())
    expected = analysis(decode_kineto(raw))
    assert analysis(check_columns_match_events(raw)) == expected
    assert analysis(read_trace(path)) == expected


def test_generated_trace_with_full_precision_times_gets_exact_columns() -> None:
    trace, _ = realistic_trace(20_000)  # times with 17 significant digits: the slow parse
    raw = json.dumps(trace).encode()
    assert analysis(check_columns_match_events(raw)) == analysis(decode_kineto(raw))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(synthetic(), st.randoms(use_true_random=False))
def test_columns_never_change_an_analysis(builder: TraceBuilder, rng: random.Random) -> None:
    trace = builder.build()
    events = list(trace["traceEvents"])
    rng.shuffle(events)
    raw = json.dumps({**trace, "traceEvents": events}).encode()
    if select_events(raw).columns is not None:
        check_columns_match_events(raw)
    assert analysis(read(raw)) == analysis(decode_kineto(raw))


def _kernel_doc(ts: str, extra: dict[str, str] | None = None) -> bytes:
    fields = {"ph": '"X"', "cat": '"kernel"', "pid": "0", "ts": ts, "dur": "1.5", **(extra or {})}
    kernel = "{" + ", ".join(f'"{k}": {v}' for k, v in fields.items()) + "}"
    return ('{"traceEvents": [' + kernel + ', {"cat": "ac2g"}]}').encode()


@pytest.mark.parametrize(
    "token",
    [
        "4458676523247.968",  # Kineto's microseconds with three decimals: the exact fast path
        "1000",
        "-0.0",
        "-0",  # an integer to the decoder: +0.0
        "-0e0",
        "0.1",
        "1e22",
        "1e23",  # past the fast path: the correctly rounded parse
        "2001.5159088058806",
        "9007199254740993",  # 2^53 + 1: rounds
        "123456789012345678901234567890",
        "2.2250738585072014e-308",
        "5e-324",
        "1.7976931348623157e308",
        "0.30000000000000004",
    ],
)
def test_times_parse_to_the_same_double_as_the_decoder(token: str) -> None:
    columns = select_events(_kernel_doc(token)).columns
    assert columns is not None
    decoded = decode_kineto(_kernel_doc(token)).events[0].ts
    assert bits(columns.kernels.ts.tolist()) == bits([decoded])
    assert bits([decoded]) == bits([float(int(token) if token.lstrip("-").isdigit() else token)])


@given(st.floats(allow_nan=False, allow_infinity=False))
def test_any_float_parses_to_the_same_double(value: float) -> None:
    columns = select_events(_kernel_doc(json.dumps(value))).columns
    assert columns is not None and bits(columns.kernels.ts.tolist()) == bits([value])


@pytest.mark.parametrize(
    ("extra", "why"),
    [
        ({"ph": '"s"'}, "a flow phase decodes without times"),
        ({"ph": '"\\u0058"'}, "an escaped phase"),
        ({"pid": '"gpu0"'}, "a pid that is not an integer"),
        ({"pid": "1.0"}, "a pid that is not an integer"),
        ({"dur": "null"}, "no duration"),
        ({"ts": '"soon"'}, "a time that is not a number"),
        ({"ts": "1e400"}, "out of range"),
        ({"args": '{"correlation": "7"}'}, "a correlation that is not an integer"),
        ({"args": '{"correlation": 7, "correlation": 8}'}, "a repeated correlation"),
        ({"t\\u0073": "5"}, "an escaped key"),
    ],
)
def test_uncertain_events_give_no_columns(extra: dict[str, str], why: str) -> None:
    assert select_events(_kernel_doc("5", extra)).columns is None, why


def test_an_event_without_a_category_names_no_launch() -> None:
    # The decoder gives such an event no category, so it is never a device event: a launch
    # whose correlation only it carries is named by nothing (found by the fuzzer).
    launch = (
        b'{"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 0, "tid": 0,'
        b' "ts": 0.0, "dur": 0.0, "args": {"correlation": 0}}'
    )
    for uncategorised in (
        b'{"args": {"correlation": 0}, "dur": 0}',
        b'{"args": {"correlation": 0}}',
    ):
        raw = b'{"traceEvents": [' + launch + b", " + uncategorised + b', {"cat": "ac2g"}]}'
        columns = check_columns_match_events(raw).columns
        assert columns is not None and len(columns.launches) == 0


def test_an_escaped_category_anywhere_gives_no_columns() -> None:
    odd = b'{"ph": "X", "c\\u0061t": "kernel", "pid": 0, "ts": 1, "dur": 1}'
    raw = _kernel_doc("5").replace(b', {"cat": "ac2g"}', b", " + odd)
    assert select_events(raw).columns is None


def test_columns_that_do_not_line_up_are_an_error() -> None:
    def trace(with_comm: bool) -> KinetoTrace:
        b = TraceBuilder()
        b.profiler_step(1, 0.0, 10.0)
        b.kernel(20.0, 5.0, launch_at=1.0)
        if with_comm:
            b.comm_kernel(30.0, 5.0, launch_at=2.0)
        return read(json.dumps(b.build()).encode())

    compute_only, with_comm = trace(False), trace(True)
    assert compute_only.columns is not None and with_comm.columns is not None
    swapped = msgspec.structs.replace(compute_only, columns=with_comm.columns)
    with pytest.raises(TraceError, match="device columns do not match"):
        analyze_trace(swapped)


def test_launch_index_keeps_the_last_of_duplicate_ids() -> None:
    def columns(ids: list[int | None]) -> EventColumns:
        n = len(ids)
        return EventColumns(
            ts=np.arange(n, dtype=float),
            dur=np.zeros(n),
            pid=np.zeros(n, np.int64),
            correlation=np.array([0 if i is None else i for i in ids], np.int64),
            has_correlation=np.array([i is not None for i in ids]),
            tid=np.zeros(n, np.int64),
            decoded=np.ones(n, bool),
            name=np.full(n, -1, np.int64),
        )

    index = LaunchIndex(columns([5, 7, 5, None, 9]))
    assert index.lookup(columns([5, 7, 9, 0, None, 8])).tolist() == [2, 1, 4, -1, -1, -1]
    assert LaunchIndex(columns([])).lookup(columns([1])).tolist() == [-1]


def test_a_communication_launch_missing_from_the_document_is_an_error() -> None:
    b = TraceBuilder()
    b.profiler_step(1, 0.0, 10.0)
    b.kernel(20.0, 5.0, launch_at=1.0)
    b.comm_kernel(30.0, 5.0, launch_at=2.0)
    trace = read(json.dumps(b.build()).encode())
    columns = trace.columns
    assert isinstance(columns, DeviceColumns)
    launches = columns.launches
    assert launches.decoded.tolist() == [False, True]  # the compute launch is columns only
    swapped = replace(launches, decoded=launches.decoded[::-1].copy())  # same count, wrong rows
    tampered = msgspec.structs.replace(trace, columns=replace(columns, launches=swapped))
    with pytest.raises(TraceError, match="device columns do not match"):
        analyze_trace(tampered)
