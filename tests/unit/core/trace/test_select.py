"""The pre-decode event selection (`_select`, C scanner `_select_c`): it leaves out only events
the analysis never reads, copies everything else byte for byte, and never hides bad JSON."""

from __future__ import annotations

import gzip
import importlib
import json
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from mfuscope.core.trace import AnalysisOptions, TraceError, analyze_trace, read_trace
from mfuscope.core.trace._events import decode_kineto
from mfuscope.core.trace._kineto import COMM_KERNEL_SUBSTRINGS
from mfuscope.core.trace._kineto import OPERATOR_PREFIXES as KINETO_PREFIXES
from mfuscope.core.trace._recompute import OPERATOR_PREFIXES as RECOMPUTE_PREFIXES
from mfuscope.core.trace._recompute import PYTHON_SUBSTRINGS
from mfuscope.core.trace._scan import (
    ANNOTATION_CATEGORIES,
    KERNEL_CATEGORIES,
    MEMOP_CATEGORIES,
    OPERATOR_CATEGORIES,
    PYTHON_CATEGORIES,
    RUNTIME_CATEGORIES,
)
from mfuscope.core.trace._select import SELECTION_AVAILABLE, Selection, select_events
from mfuscope.core.trace._steps import OPERATOR_PREFIXES as STEP_PREFIXES
from msgspec.structs import astuple

from tests.support.shared_data import real_trace_params, require
from tests.support.trace_builder import GLOO_TIDS, TraceBuilder, realistic_trace
from tests.support.trace_strategies import synthetic

pytestmark = pytest.mark.usefixtures("scan_mode")  # every test with both scans

REAL = real_trace_params()

RECOMPUTE_FN = "torch/utils/checkpoint.py(1): recompute_fn"
DEVICE = {*KERNEL_CATEGORIES, *MEMOP_CATEGORIES}
KEPT = {*DEVICE, *ANNOTATION_CATEGORIES}
PREFIXES = (*STEP_PREFIXES, *KINETO_PREFIXES, *RECOMPUTE_PREFIXES)


def _correlation(event: dict[str, Any]) -> tuple[bool, Any]:
    args = event.get("args")
    if not isinstance(args, dict) or "correlation" not in args:
        return False, None
    return True, args["correlation"]


def _str(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def _plain_id(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and abs(value) < 10**18


def linked_ids(events: list[Any]) -> set[int] | None:
    """Correlation ids of the events that are (or may be) device events; None when one of
    them cannot be read, and then every launch stays. An event with no category is never a
    device event (the decoder gives it none)."""
    out: set[int] = set()
    for event in events:
        if not isinstance(event, dict) or "cat" not in event:
            continue
        cat = event.get("cat")
        if isinstance(cat, str) and cat not in DEVICE:
            continue
        present, value = _correlation(event)
        if not present:
            continue
        if not _plain_id(value):
            return None
        out.add(value)
    return out


@dataclass(frozen=True)
class Context:
    """What the rules depend on beyond the event itself."""

    device_trace: bool  # the trace has device events
    linked: set[int] | None  # correlation ids device events name (None: every launch stays)
    lean: bool  # the columns were read: device events known only by number are not decoded
    decoded_links: set[int] | None  # ids named by the device events left in the document


def names_communication(name: str) -> bool:
    return any(part in name.lower() for part in COMM_KERNEL_SUBSTRINGS)


def droppable(event: Any, context: Context) -> bool:
    """The rules of `_select`, restated on decoded JSON (the scanner may keep more: escapes)."""
    if not isinstance(event, dict) or not isinstance(event.get("cat"), str):
        return False
    cat, name = event["cat"], event.get("name")
    if cat in KERNEL_CATEGORIES:  # with columns, only communication kernels are decoded
        return context.lean and isinstance(name, str) and not names_communication(name)
    if cat in MEMOP_CATEGORIES:
        return context.lean
    if cat in KEPT:
        return False
    if cat in RUNTIME_CATEGORIES:
        present, value = _correlation(event)
        named = context.decoded_links if context.lean else context.linked
        return named is not None and present and _plain_id(value) and value not in named
    if cat in OPERATOR_CATEGORIES:
        return context.device_trace and isinstance(name, str) and not name.startswith(PREFIXES)
    if cat in PYTHON_CATEGORIES:
        return isinstance(name, str) and not any(s in name for s in PYTHON_SUBSTRINGS)
    return True


def same_selection(a: Selection, b: Selection) -> bool:
    if a.document != b.document or (a.columns is None) != (b.columns is None):
        return False
    if a.columns is None or b.columns is None:
        return True
    if a.columns.kernel_names != b.columns.kernel_names:
        return False
    buckets = ("kernels", "memops", "launches")
    pairs = (
        zip(astuple(getattr(a.columns, n)), astuple(getattr(b.columns, n)), strict=True)
        for n in buckets
    )
    return all(np.array_equal(x, y) for bucket in pairs for x, y in bucket)


def document_of(raw: bytes) -> bytes | None:
    return select_events(raw).document


def strict_json(raw: bytes) -> Any:
    def reject(constant: str) -> None:
        raise ValueError(f"not JSON: {constant}")

    return json.loads(raw, parse_constant=reject)


def check_selection(raw: bytes) -> bytes:
    """Select from `raw` (valid JSON) and check the result is `raw` minus droppable events."""
    selected = document_of(raw)
    if selected is None:
        return raw
    whole, chosen = strict_json(raw), strict_json(selected)
    events = whole.pop("traceEvents")
    kept = chosen.pop("traceEvents")
    assert chosen == whole  # every other member unchanged
    context = Context(
        device_trace=any(isinstance(e, dict) and _str(e.get("cat")) in DEVICE for e in events),
        linked=linked_ids(events),
        lean=select_events(raw).columns is not None,
        decoded_links=linked_ids(kept),
    )
    position = 0
    for event in events:  # kept is a subsequence; whatever was left out was droppable
        if position < len(kept) and kept[position] == event:
            position += 1
        else:
            assert droppable(event, context), event
    assert position == len(kept)
    assert len(kept) < len(events)
    return selected


def analysed(raw: bytes) -> Any:
    """The analysis of the whole document, every event decoded."""
    return analyze_trace(decode_kineto(raw), AnalysisOptions(gpus_per_node=4))


def analysed_selection(raw: bytes) -> Any:
    """The analysis as `read_trace` makes it: the selected document and the columns."""
    selection = select_events(raw)
    trace = decode_kineto(selection.document if selection.document is not None else raw)
    trace = msgspec.structs.replace(trace, columns=selection.columns)
    return analyze_trace(trace, AnalysisOptions(gpus_per_node=4))


def _launch(correlation: Any) -> dict[str, Any]:
    args = {"correlation": correlation}
    return {"ph": "X", "cat": "cuda_runtime", "name": "cudaEventRecord", "args": args}


def test_the_scanner_is_built_here() -> None:
    # setup.py builds it as optional; on these machines a missing build is a regression.
    assert SELECTION_AVAILABLE


def _doc(*events: dict[str, Any], device: bool = True) -> bytes:
    kernel = {"ph": "X", "cat": "kernel", "name": "k", "args": {"correlation": 7}}
    base: list[dict[str, Any]] = [kernel] if device else []
    return json.dumps({"schemaVersion": 1, "traceEvents": [*base, *events]}).encode()


@pytest.mark.parametrize(
    ("event", "device", "kept"),
    [
        ({"ph": "s", "cat": "ac2g", "name": "ac2g", "id": 1}, True, False),
        ({"ph": "f", "cat": "fwdbwd", "name": "fwdbwd", "bp": "e"}, True, False),
        # device-side ranges: read for user-chosen windows (`_windows`)
        ({"ph": "X", "cat": "gpu_user_annotation", "name": "ProfilerStep#1"}, True, True),
        ({"ph": "X", "cat": "cpu_op", "name": "aten::mm"}, True, False),
        ({"ph": "X", "cat": "cpu_op", "name": "aten::mm"}, False, True),  # host-only: compute
        ({"ph": "X", "cat": "cpu_op", "name": "record_param_comms"}, True, True),
        ({"ph": "X", "cat": "cpu_op", "name": "ProfilerStep#4"}, True, True),
        ({"ph": "X", "cat": "Operator", "name": "CheckpointFunctionBackward"}, True, True),
        (
            {"ph": "X", "cat": "cpu_op", "name": "autograd::engine::evaluate_function: MmBw"},
            True,
            True,
        ),
        ({"ph": "X", "cat": "python_function", "name": "model.py(10): forward"}, False, False),
        (
            {"ph": "X", "cat": "python_function", "name": RECOMPUTE_FN},
            True,
            True,
        ),
        ({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel"}, True, True),  # no id
        (_launch(7), True, True),  # the kernel's own launch
        (_launch(8), True, False),  # launches nothing that is on the device
        (_launch("8"), True, True),  # not an integer id: the decoder decides
        (_launch(8.0), True, True),
        ({"ph": "X", "cat": "user_annotation", "name": "anything"}, True, True),
        ({"ph": "M", "name": "thread_name", "args": {"name": "x"}}, True, True),  # no cat
        ({"ph": "X", "cat": 7, "name": "aten::mm"}, True, True),  # not a string: decoder decides
        ({"ph": "X", "cat": "cpu_op", "name": None}, True, True),  # not a string
        ({"ph": "X", "cat": "cpu_op", "name": "a\\u0062c"}, True, True),  # escaped
        ({"ph": "X", "cat": "cpu\\u005fop", "name": "aten::mm"}, True, True),
        ({"ph": "X", "c\\u0061t": "ac2g"}, True, True),  # an escaped key could be "cat"
        (5, True, True),  # not an object: decoder decides
    ],
)
def test_what_is_left_out(event: Any, device: bool, kept: bool) -> None:
    raw = _doc(event, device=device).replace(b"\\\\u", b"\\u")  # keep the escapes as written
    selected = document_of(raw)
    events = strict_json(selected if selected is not None else raw)["traceEvents"]
    assert (strict_json(raw)["traceEvents"][-1] in events) == kept


@pytest.mark.parametrize(
    "device_args",
    [
        '{"correlation": "7"}',
        '{"correlation": 7.5}',
        '{"correlation": null}',
        '{"correlation": 7, "correlation": 8}',
        '{"correl\\u0061tion": 7}',
        '{"correlation": 1234567890123456789}',  # 19 digits: not compared
    ],
)
def test_a_device_link_it_cannot_read_keeps_every_launch(device_args: str) -> None:
    kernel = '{"cat": "kernel", "args": ' + device_args + "}"
    raw = '{"traceEvents": [' + kernel + ', {"cat": "ac2g"}, ' + json.dumps(_launch(9)) + "]}"
    selected = document_of(raw.encode())
    assert selected is not None and b"cudaEventRecord" in selected


def test_an_event_that_may_be_a_device_event_keeps_its_launch() -> None:
    odd = '{"c\\u0061t": "kernel", "args": {"correlation": 9}}'  # an escaped "cat"
    events = ['{"cat": "kernel"}', '{"cat": "ac2g"}', odd, json.dumps(_launch(9))]
    selected = document_of(('{"traceEvents": [' + ", ".join(events) + "]}").encode())
    assert selected is not None and b"ac2g" not in selected and b"cudaEventRecord" in selected


def test_duplicate_keys_keep_the_event() -> None:
    raw = b'{"traceEvents": [{"cat": "kernel"}, {"cat": "ac2g", "cat": "cpu_op"}]}'
    assert document_of(raw) is None


@pytest.mark.parametrize("path", REAL)
def test_real_traces_lose_only_unread_events_and_analyse_the_same(path: Path) -> None:
    raw = gzip.decompress(require(path).read_bytes())
    selected = check_selection(raw)
    assert len(selected) < 0.6 * len(raw)  # most of a GPU trace is never read
    assert analysed_selection(raw) == analysed(raw)


def test_generated_trace_analyses_the_same() -> None:
    trace, _ = realistic_trace(20_000)
    raw = json.dumps(trace).encode()
    check_selection(raw)
    assert analysed_selection(raw) == analysed(raw)


def test_gloo_trace_keeps_its_operators() -> None:
    b = TraceBuilder(gpu=False, world_size=2)
    b.thread_name(GLOO_TIDS[0], "pt_gloo_runloop")
    b.profiler_step(1, 0.0, 100.0)
    b.cpu_op("aten::linear", 5.0, 25.0)
    b.python_function("model.py(3): forward", 4.0, 30.0)
    b.gloo("all_reduce", 45.0, 30.0, nelems=1000)
    raw = json.dumps(b.build()).encode()
    selected = check_selection(raw)
    assert b'"aten::linear"' in selected and b"forward" not in selected
    assert analysed_selection(raw) == analysed(raw)


def _noise(rng: random.Random, n: int) -> list[dict[str, Any]]:
    """Events of every kind the analysis skips, plus look-alikes it must keep."""
    names = ["aten::mm", "record_param_comms", "ProfilerStep#5", "CheckpointFunctionBackward"]
    out: list[dict[str, Any]] = []
    for i in range(n):
        t = float(rng.randint(0, 400))
        kind = rng.randrange(6)
        if kind == 0:
            out.append({"ph": rng.choice("stf"), "cat": "ac2g", "id": i, "ts": t, "pid": 0})
        elif kind == 1:
            out.append({"ph": "X", "cat": "python_function", "name": "m.py(1): f", "ts": t})
        elif kind == 2:
            name = rng.choice(names)
            out.append({"ph": "X", "cat": "cpu_op", "name": name, "ts": t, "dur": 1.0, "tid": 9})
        elif kind == 3:
            out.append({"ph": "X", "cat": "gpu_user_annotation", "name": "x", "ts": t})
        elif kind == 4:
            out.append({"ph": "i", "cat": "cpu_instant_event", "name": "x", "ts": t, "s": "t"})
        else:  # a launch of nothing on the device (event records, syncs, ...)
            out.append({**_launch(10**6 + i), "ts": t, "dur": 1.0, "pid": 4242, "tid": 4242})
    return out


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(synthetic(), st.integers(0, 30), st.randoms(use_true_random=False))
def test_selection_never_changes_an_analysis(
    builder: TraceBuilder, n_noise: int, rng: random.Random
) -> None:
    trace = builder.build()
    events = trace["traceEvents"] + _noise(rng, n_noise)
    rng.shuffle(events)
    raw = json.dumps({**trace, "traceEvents": events}).encode()
    check_selection(raw)
    try:
        expected: Any = analysed(raw)
    except TraceError as exc:  # e.g. no step has device activity: the same error both ways
        expected = exc.message
    try:
        got: Any = analysed_selection(raw)
    except TraceError as exc:
        got = exc.message
    assert got == expected


_VALID = (
    b'{"a": [1, -2.5e3, true, false, null, "x\\"y"], "traceEvents": [{"cat": "kernel"}, '
    b'{"ph": "s", "cat": "ac2g", "args": {"k": [0.5, {"q": "\\u00e9\\n\\ud83d\\ude00"}]}}, '
    b'{"cat": "ac2g", "name": "\xc3\xa9t\xc3\xa9 \xf0\x9f\x98\x80"}], "z": {}}'
)


@pytest.mark.parametrize(
    "bad_flow_event",
    [
        b'{"cat": "ac2g", "name": "\\q"}',  # unknown escape
        b'{"cat": "ac2g", "name": "\\u12g4"}',  # bad \u escape
        b'{"cat": "ac2g", "name": "a\tb"}',  # raw control character
        b'{"cat": "ac2g", "id": 01}',  # leading zero
        b'{"cat": "ac2g", "id": 1.}',
        b'{"cat": "ac2g", "id": -}',
        b'{"cat": "ac2g", "id": 1e}',
        b'{"cat": "ac2g", "id": NaN}',
        b'{"cat": "ac2g", "id": tru}',
        b'{"cat": "ac2g", "x": [1, 2,]}',  # trailing comma
        b'{"cat": "ac2g", "x": {"a" 1}}',  # no colon
        b"{'cat': 'ac2g'}",  # single quotes
        b'{"cat": "ac2g" "id": 1}',  # no comma
        b'{"cat": "ac2g"',  # unterminated
        b'{"cat": "ac2g", "name": "\xff"}',  # not UTF-8
        b'{"cat": "ac2g", "name": "\xc3"}',  # a sequence cut short
        b'{"cat": "ac2g", "name": "\xc0\xaf"}',  # overlong
        b'{"cat": "ac2g", "name": "\xed\xa0\x80"}',  # a surrogate written as UTF-8
        b'{"cat": "ac2g", "name": "\xf4\x90\x80\x80"}',  # past U+10FFFF
        b'{"cat": "ac2g", "name": "\\ud800"}',  # a lone high surrogate
        b'{"cat": "ac2g", "name": "\\udc00x"}',  # a lone low surrogate
        b'{"cat": "ac2g", "name": "\\ud800\\u0041"}',  # a high one without its low one
        b'{"cat": "ac2g", "dur": 1e400}',  # overflows a double: "Number out of range"
        b'{"cat": "ac2g", "dur": -0.2e310}',
        b'{"cat": "ac2g", "dur": 1' + b"0" * 400 + b"}",
    ],
)
def test_bad_json_in_an_event_left_out_is_still_an_error(
    tmp_path: Path, bad_flow_event: bytes
) -> None:
    assert document_of(_VALID) is not None
    raw = b'{"traceEvents": [{"cat": "kernel"}, ' + bad_flow_event + b"]}"
    assert document_of(raw) is None  # the decoder reads the file itself and says why
    path = tmp_path / "bad.json"
    path.write_bytes(raw)
    with pytest.raises(TraceError, match=r"not JSON|not a Kineto trace|out of range"):
        read_trace(path)


@pytest.mark.parametrize(
    "raw",
    [
        b"[]",
        b'{"other": []}',
        b'{"traceEvents": {}}',
        b'{"traceEvents": [], "traceEvents": []}',
        b'{"traceEvents": [{"cat": "kernel"},]}',
        b'{"traceEvents": [,{"cat": "ac2g"}]}',
        b'{"traceEvents": [{"cat": "kernel"} {"cat": "ac2g"}]}',
        b'{"traceEvents": [{"cat": "kernel"}, {"cat": "ac2g", "x": ' + b"[" * 600 + b"]" * 600
        + b"}]}",  # deeper than the scanner follows
        b"",
    ],
)  # fmt: skip
def test_documents_it_does_not_understand_are_decoded_whole(raw: bytes) -> None:
    assert document_of(raw) is None


def test_bad_json_outside_the_events_is_copied_for_the_decoder_to_report(tmp_path: Path) -> None:
    raw = b'{"traceEvents": [{"cat": "kernel"}, {"cat": "ac2g"}]'  # the object never closes
    assert document_of(raw) == b'{"traceEvents": [{"cat": "kernel"}]'
    path = tmp_path / "t.json"
    path.write_bytes(raw)
    with pytest.raises(TraceError, match="not JSON"):
        read_trace(path)


def test_an_error_names_the_event_index_of_the_file(tmp_path: Path) -> None:
    events = [{"ph": "s", "cat": "ac2g", "id": i} for i in range(5)]
    events.append({"ph": "X", "cat": "kernel", "name": "k", "ts": "soon", "dur": 1.0})
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"traceEvents": events}))
    with pytest.raises(TraceError, match=r"traceEvents\[5\]"):
        read_trace(path)


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_mutated_documents_never_pass_as_other_json(data: st.DataObject) -> None:
    """A byte flipped, dropped or added anywhere: the selection is None, or it is valid JSON
    exactly when the document is, and then the document minus droppable events."""
    raw = bytearray(_VALID)
    for _ in range(data.draw(st.integers(1, 3))):
        at = data.draw(st.integers(0, len(raw) - 1))
        op = data.draw(st.sampled_from(("flip", "drop", "add")))
        byte = data.draw(st.sampled_from(b' "\\{}[],:0123456789.eE+-truefalsnul\t\nxac2g'))
        if op == "flip":
            raw[at] = byte
        elif op == "drop":
            del raw[at]
        else:
            raw.insert(at, byte)
    document = bytes(raw)
    selected = document_of(document)
    if selected is None:
        return
    try:
        strict_json(document)
    except ValueError:
        with pytest.raises(ValueError):
            strict_json(selected)
        return
    check_selection(document)


@pytest.mark.parametrize("path", REAL)
def test_without_the_compiled_scanner_read_trace_gives_the_same_analysis(
    path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from mfuscope.core.trace import _select

    expected = analyze_trace(read_trace(require(path)))
    monkeypatch.setattr(_select, "_select_c", None)  # as if built without a C compiler
    assert _select.select_events(b'{"traceEvents": []}') == _select.Selection(None, None)
    plain = read_trace(path)
    assert plain.columns is None
    assert analyze_trace(plain) == expected


def test_two_halves_join_on_real_traces_and_a_false_split_point_is_abandoned() -> None:
    scanner = importlib.import_module("mfuscope.core.trace._select_c")
    previous = scanner.set_split_min_bytes(0)
    try:
        raw = gzip.decompress(require(REAL[0].values[0]).read_bytes())
        joined, abandoned = scanner.split_counts()
        halves = select_events(raw)
        assert scanner.split_counts() == (joined + 1, abandoned)
        # A name holding "}, {" just after the middle, where the split point is looked for.
        trap = {"ph": "X", "cat": "ac2g", "name": "x" * 4000 + "}, {" + "y" * 50}
        events = [{"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "ts": 1, "dur": 1}, trap]
        tricky = json.dumps({"traceEvents": [*events, {"ph": "s", "cat": "ac2g"}]}).encode()
        tricky_halves = select_events(tricky)
        assert scanner.split_counts() == (joined + 1, abandoned + 1)
        scanner.set_split_min_bytes(-1)
        assert same_selection(select_events(tricky), tricky_halves)  # as one thread's scan
        assert same_selection(select_events(raw), halves)
    finally:
        scanner.set_split_min_bytes(previous)
