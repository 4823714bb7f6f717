"""The device columns the C selection reads (`_columns`): exactly the decoded events' values,
or none at all, and the same analysis either way."""

from __future__ import annotations

import gzip
import json
import math
import random
import struct
import sys
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from mfuscope.agent.analysis import AnalysisOptions, TraceError, analyze_trace, read_trace
from mfuscope.agent.analysis._columns import DeviceColumns, EventColumns, LaunchIndex
from mfuscope.agent.analysis._events import KinetoTrace, decode_kineto
from mfuscope.agent.analysis._scan import Event, scan_events
from mfuscope.agent.analysis._select import select_events

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_decompose_properties import synthetic
from trace_builder import TraceBuilder, realistic_trace

TRACES = Path(__file__).resolve().parents[2] / ".." / "shared" / "traces"
REAL = sorted(TRACES.glob("*/*.json.gz"))


def read(raw: bytes) -> KinetoTrace:
    """What `read_trace` does with `raw`: the selected document, decoded, with its columns."""
    selection = select_events(raw)
    trace = decode_kineto(selection.document if selection.document is not None else raw)
    return msgspec.structs.replace(trace, columns=selection.columns)


def bits(values: Any) -> list[bytes]:
    return [struct.pack("<d", v) for v in values]


def check_columns_match_events(trace: KinetoTrace) -> None:
    columns = trace.columns
    assert isinstance(columns, DeviceColumns)
    scanned = scan_events(trace.events)

    def compare(events: list[Event], column: EventColumns, device: bool) -> None:
        assert len(column) == len(events)
        assert bits(column.ts.tolist()) == bits(e.ts for e in events)  # bit for bit
        present = [e.args is not None and e.args.correlation is not None for e in events]
        assert column.has_correlation.tolist() == present
        ids = [e.args.correlation for e, p in zip(events, present, strict=True) if p]
        assert column.correlation[column.has_correlation].tolist() == ids
        if device:
            assert bits(column.dur.tolist()) == bits(e.dur for e in events)
            assert column.pid.tolist() == [e.pid for e in events]

    compare(scanned.kernels, columns.kernels, True)
    compare(scanned.memops, columns.memops, True)
    compare(scanned.runtime, columns.launches, False)


def analyses_agree(trace: KinetoTrace) -> Any:
    """The analysis with the columns and from the decoded events alone; returns it."""
    options = AnalysisOptions(gpus_per_node=4)

    def run(t: KinetoTrace) -> Any:
        try:
            return analyze_trace(t, options)
        except TraceError as exc:
            return exc.message

    with_columns = run(trace)
    assert with_columns == run(msgspec.structs.replace(trace, columns=None))
    return with_columns


@pytest.mark.parametrize("path", REAL, ids=lambda p: p.parent.name)
def test_real_traces_get_columns_equal_to_their_events(path: Path) -> None:
    trace = read(gzip.decompress(path.read_bytes()))
    check_columns_match_events(trace)
    assert analyses_agree(trace) == analyze_trace(read_trace(path), AnalysisOptions(4))


def test_generated_trace_with_full_precision_times_gets_exact_columns() -> None:
    trace, _ = realistic_trace(20_000)  # times with 17 significant digits: the slow parse
    checked = read(json.dumps(trace).encode())
    check_columns_match_events(checked)
    analyses_agree(checked)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(synthetic(), st.randoms(use_true_random=False))
def test_columns_never_change_an_analysis(builder: TraceBuilder, rng: random.Random) -> None:
    trace = builder.build()
    events = list(trace["traceEvents"])
    rng.shuffle(events)
    checked = read(json.dumps({**trace, "traceEvents": events}).encode())
    if checked.columns is not None:
        check_columns_match_events(checked)
    analyses_agree(checked)


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
    assert bits(columns.kernels.ts.tolist()) == bits([float(token)])
    assert math.copysign(1, columns.kernels.ts[0]) == math.copysign(1, float(token))


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


def test_an_escaped_category_anywhere_gives_no_columns() -> None:
    odd = b'{"ph": "X", "c\\u0061t": "kernel", "pid": 0, "ts": 1, "dur": 1}'
    raw = _kernel_doc("5").replace(b', {"cat": "ac2g"}', b", " + odd)
    assert select_events(raw).columns is None


def test_columns_that_do_not_line_up_are_ignored() -> None:
    b = TraceBuilder()
    b.profiler_step(1, 0.0, 10.0)
    b.kernel(20.0, 5.0, launch_at=1.0)
    trace = read(json.dumps(b.build()).encode())
    assert trace.columns is not None
    empty = EventColumns(np.empty(0), np.empty(0), np.empty(0, np.int64), np.empty(0, np.int64),
                         np.empty(0, bool))  # fmt: skip
    wrong = DeviceColumns(empty, empty, empty)  # no kernels: would say "no device work"
    assert analyze_trace(msgspec.structs.replace(trace, columns=wrong)) == analyze_trace(trace)


def test_launch_index_keeps_the_last_of_duplicate_ids() -> None:
    def columns(ids: list[int | None]) -> EventColumns:
        n = len(ids)
        return EventColumns(
            ts=np.arange(n, dtype=float),
            dur=np.zeros(n),
            pid=np.zeros(n, np.int64),
            correlation=np.array([0 if i is None else i for i in ids], np.int64),
            has_correlation=np.array([i is not None for i in ids]),
        )

    index = LaunchIndex(columns([5, 7, 5, None, 9]))
    assert index.lookup(columns([5, 7, 9, 0, None, 8])).tolist() == [2, 1, 4, -1, -1, -1]
    assert LaunchIndex(columns([])).lookup(columns([1])).tolist() == [-1]
