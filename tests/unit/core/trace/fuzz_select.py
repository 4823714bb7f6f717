"""A fuzz corpus for the C pre-filter, run under AddressSanitizer and UBSan.

Not collected by the plain suite (the file name does not start with ``test_``):
`test_select_sanitized.py` runs it, with `test_select.py` and `test_columns.py`, in a child
process that loads the sanitized build (`tests.support.sanitized_select`). Every input is
scanned by the sanitized build and by the production build (-O2, no sanitizers), which must
give the same bytes; where it is cheap (documents of ~100 kB), the selection is also held
against the Python fallback, the whole document decoded: the kept events are the document
minus events the analysis never reads, JSON the decoder rejects stays rejected, and the
columns equal the decoded events' values.

Corpus: the real traces (``../shared/traces``, ``tests/data``) truncated anywhere and with
bytes flipped, dropped or added; excerpts of them small enough to decode; and documents
Hypothesis writes token by token (odd number spellings, escapes, repeated keys, deep nesting).
"""

from __future__ import annotations

import gzip
import importlib.machinery
import importlib.util
import random
import sys
from collections.abc import Callable, Iterator
from functools import cache
from pathlib import Path
from types import ModuleType
from typing import Any

import msgspec
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from mfuscope.core import trace as trace_package
from mfuscope.core.trace import TraceError, _select
from mfuscope.core.trace._events import decode_kineto

from tests.support.sanitized_select import MODULE, PATH_ENV
from tests.support.shared_data import real_trace_params, require
from tests.unit.core.trace.test_columns import check_columns_match_events
from tests.unit.core.trace.test_select import check_selection

ROOT = Path(__file__).resolve().parents[4]
GLOO = sorted((ROOT / "tests" / "data" / "gloo-ddp-2rank").glob("*.json.gz"))
REAL = [*real_trace_params(), *(pytest.param(p, id=f"gloo-{p.stem}") for p in GLOO)]
# Real traces are cut at random places and corrupted this many times each (two scan modes).
CUTS, MUTANTS, EXCERPT_MUTANTS = 4, 3, 30
EXCERPT_BYTES = 100_000
PADDED = 1024  # bytes: past pymalloc's largest block (512), in ASan's malloc
# Bytes mutations add: JSON's own, and bytes that make or break UTF-8 sequences.
STRUCTURAL = b' "\\{}[],:0123456789.eE+-truefalsnul\t\nxac2gkd\xc3\xa9\xed\xa0\x80\xff'

Scan = Callable[..., tuple[bytes | None, Any]]


def _plain_module() -> ModuleType:
    """The production build beside the package, loaded under another name."""
    folder = Path(trace_package.__file__).parent
    built = sorted(folder.glob("_select_c*.so")) + sorted(folder.glob("_select_c*.pyd"))
    if not built:
        pytest.fail(f"no production build of _select_c in {folder}")
    loader = importlib.machinery.ExtensionFileLoader("_plain._select_c", str(built[0]))
    spec = importlib.util.spec_from_file_location("_plain._select_c", built[0], loader=loader)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


@cache
def _builds() -> tuple[ModuleType, ModuleType]:
    return sys.modules[MODULE], _plain_module()


@pytest.fixture(params=["one thread", "two halves"])
def split(request: pytest.FixtureRequest) -> Iterator[None]:
    """Both builds scan big arrays in two halves on two threads, or never."""
    value = 0 if request.param == "two halves" else -1
    previous = [m.set_split_min_bytes(value) for m in _builds()]
    yield
    for module, old in zip(_builds(), previous, strict=True):
        module.set_split_min_bytes(old)


def scanned(raw: bytes) -> tuple[bytes | None, Any]:
    """The sanitized build's selection of `raw`, checked equal to the production build's.
    A small `raw` is also scanned padded with leading whitespace past pymalloc's 512 bytes,
    so that it comes from ASan's malloc with a red zone just past its end."""
    sanitized, plain = _builds()
    got = sanitized.select_events(raw, *_select._RULES)
    assert got == plain.select_events(raw, *_select._RULES)
    if len(raw) < PADDED:
        padded = b" " * (PADDED - len(raw)) + raw
        again = sanitized.select_events(padded, *_select._RULES)
        assert (again[0] is None) == (got[0] is None)
    return got


def decodes(raw: bytes) -> bool:
    """Whether the decoder `read_trace` uses (msgspec) takes `raw` as JSON."""
    try:
        msgspec.json.decode(raw)
    except msgspec.DecodeError:
        return False
    return True


def check_against_fallback(raw: bytes) -> None:
    """`raw` through the sanitized scanner, held against decoding `raw` whole."""
    document, columns = scanned(raw)
    if document is None:
        return  # the fallback: `raw` decoded as it is
    valid = decodes(raw)
    assert decodes(document) == valid  # bad JSON is never hidden by being left out
    if not valid:
        return
    check_selection(raw)
    if columns is None:
        return
    try:
        decode_kineto(raw)
    except (TraceError, msgspec.ValidationError):
        return  # a bad value the decoder reports: nothing to compare the columns with
    check_columns_match_events(raw)


def mutated(raw: bytes, rng: random.Random, edits: int) -> bytes:
    out = bytearray(raw)
    for _ in range(edits):
        at = rng.randrange(len(out))
        op = rng.randrange(3)
        byte = STRUCTURAL[rng.randrange(len(STRUCTURAL))]
        if op == 0:
            out[at] = byte
        elif op == 1:
            del out[at]
        else:
            out.insert(at, byte)
    return bytes(out)


@cache
def real_bytes(path: Path) -> bytes:
    return gzip.decompress(require(path).read_bytes())


def excerpt(raw: bytes, size: int) -> bytes:
    """The real bytes of `raw` up to the first event that ends past `size`, closed: a valid
    document of the trace's own events and formatting, small enough to decode."""
    start = raw.index(b'"traceEvents"')
    start = raw.index(b"[", start) + 1
    depth, in_string, escaped = 0, False, False
    for at in range(start, len(raw)):
        ch = raw[at]
        if in_string:
            if escaped:
                escaped = False
            elif ch == 0x5C:  # backslash
                escaped = True
            elif ch == 0x22:
                in_string = False
        elif ch == 0x22:
            in_string = True
        elif ch in b"{[":
            depth += 1
        elif ch in b"}]":
            depth -= 1
            if depth == 0 and at >= start + size:
                return raw[: at + 1] + b"]}"
    raise AssertionError("trace shorter than the excerpt")


def test_the_sanitized_build_is_the_one_under_test() -> None:
    sanitized = sys.modules[MODULE]
    assert sanitized.__file__ is not None
    assert Path(sanitized.__file__) == Path(__import__("os").environ[PATH_ENV])
    assert _select._select_c is sanitized.select_events


@pytest.mark.usefixtures("split")
@pytest.mark.parametrize("path", REAL)
def test_truncated_real_traces(path: Path) -> None:
    raw = real_bytes(path)
    rng = random.Random(len(raw))
    middle = len(raw) // 2  # where the two halves are split
    cuts = {rng.randrange(1, len(raw)) for _ in range(CUTS)} | {middle, middle + 7, len(raw) - 2}
    for cut in sorted(cuts):
        document, _ = scanned(raw[:cut])
        # A proper prefix of a JSON object is not JSON: the selection is none, or not JSON.
        if document is not None:
            with pytest.raises(msgspec.DecodeError):
                msgspec.json.decode(document)


@pytest.mark.usefixtures("split")
@pytest.mark.parametrize("path", REAL)
def test_corrupted_real_traces_scan_alike_in_both_builds(path: Path) -> None:
    raw = real_bytes(path)
    rng = random.Random(len(raw) + 1)
    flows = [i for i in range(0, len(raw), 4096) if raw.startswith(b'"ac2g"', i)] or [0]
    for _ in range(MUTANTS):
        scanned(mutated(raw, rng, rng.randint(1, 4)))
    # In the events left out, whose JSON is checked but never decoded.
    at = raw.find(b'"ac2g"', len(raw) // 3)
    if at > 0:
        for offset in (-9, -1, 3, 17):
            scanned(raw[: at + offset] + b"\\" + raw[at + offset + 1 :])
    assert flows


@pytest.mark.parametrize("path", REAL)
def test_real_excerpts_and_their_corruptions_against_the_fallback(path: Path) -> None:
    small = excerpt(real_bytes(path), EXCERPT_BYTES)
    check_against_fallback(small)
    rng = random.Random(len(small))
    for _ in range(EXCERPT_MUTANTS):
        check_against_fallback(mutated(small, rng, rng.randint(1, 3)))


# Documents written token by token: the spellings the scanner's own readers must get right,
# mostly valid (so that events are left out and columns read), sometimes not.
GOOD_NUMBERS = st.one_of(
    st.integers(-(2**70), 2**70).map(str),
    st.floats(allow_nan=False, allow_infinity=False).map(repr),
    st.sampled_from(
        [
            "-0", "0.0", "1e400", "-1e400", "1e-400", "4.9e-324", "2.2250738585072014e-308",
            "1.7976931348623157e308", "9007199254740993", "123456789012345678901234567890",
            "0.000000000000000000000000000001", "1E+2", "1e-0", "4458676523247.968",
        ]
    ),
)  # fmt: skip
BAD_NUMBERS = st.sampled_from(["01", "1.", "-", ".5", "1e", "+1", "0x10", "NaN", "Infinity"])
NUMBERS = GOOD_NUMBERS
CATEGORIES = st.sampled_from(
    [
        '"kernel"', '"ac2g"', '"ac2g"', '"fwdbwd"', '"cpu_op"', '"cpu_op"', '"cuda_runtime"',
        '"cuda_runtime"', '"cuda_driver"', '"python_function"', '"gpu_memcpy"', '"gpu_memset"',
        '"user_annotation"', '"gpu_user_annotation"', '"cpu_instant_event"', '"Trace"',
    ]
)  # fmt: skip
NAMES = st.sampled_from(
    [
        '"ncclKernel_AllReduce_RING"', '"ncclDevKernel_SendRecv"', '"volta_sgemm_128x64_nn"',
        '"aten::mm"', '"ProfilerStep#1"', '"record_param_comms"', '"cudaLaunchKernel"',
        '"cudaEventRecord"', '"torch/utils/checkpoint.py(1): recompute_fn"', '"m.py(3): f"',
        '"CheckpointFunctionBackward"', '"\\u00e9t\\u00e9"', '"\u00e9t\u00e9"', '""',
    ]
)  # fmt: skip
ODD_STRINGS = st.one_of(
    st.sampled_from(['"c\\u0061t"', '"k\\u0065rnel"', '"\\ud800"', '"\\"\\/\\b"']),
    st.text(max_size=12).map(lambda s: msgspec.json.encode(s).decode()),
)
BAD_STRINGS = st.sampled_from(['"\\"', '"a\\q"', '"\\u12"', '"t\tb"', "'x'"])
STRINGS = st.one_of(CATEGORIES, NAMES, NAMES, ODD_STRINGS)
KEYS = st.sampled_from(
    ['"cat"', '"name"', '"ph"', '"ts"', '"dur"', '"pid"', '"tid"', '"args"', '"correlation"',
     '"id"', '"c\\u0061t"', '"x"']
)  # fmt: skip
SPACE = st.sampled_from(["", " ", "\n  ", "\t", "                  "])


def _value(children: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
    members = st.lists(st.tuples(KEYS, SPACE, children), max_size=6)
    objects = members.map(lambda ms: "{" + ", ".join(f"{k}:{s}{v}" for k, s, v in ms) + "}")
    arrays = st.lists(children, max_size=4).map(lambda vs: "[" + ",".join(vs) + "]")
    return objects | arrays


VALUES = st.recursive(
    NUMBERS | STRINGS | st.sampled_from(["true", "false", "null"]), _value, max_leaves=12
)
BAD_TOKENS = BAD_NUMBERS | BAD_STRINGS | st.sampled_from(["tru", "nul", "[1,]", '{"a" 1}'])


@st.composite
def event(draw: st.DrawFn) -> str:
    fields = {
        '"ph"': draw(st.sampled_from(['"X"', '"X"', '"s"', '"f"', '"i"', '"M"'])),
        '"cat"': draw(st.one_of(CATEGORIES, CATEGORIES, CATEGORIES, STRINGS)),
        '"name"': draw(STRINGS),
        '"pid"': draw(st.one_of(NUMBERS, NUMBERS, STRINGS)),
        '"tid"': draw(NUMBERS),
        '"ts"': draw(NUMBERS),
        '"dur"': draw(NUMBERS),
        '"args"': '{"correlation": ' + draw(st.integers(0, 6).map(str) | NUMBERS) + "}",
    }
    chosen = draw(st.lists(st.sampled_from(sorted(fields)), unique=True, min_size=2))
    extra = draw(st.lists(st.tuples(KEYS, VALUES), max_size=2))
    members = [(k, fields[k]) for k in chosen] + extra
    sep = draw(SPACE)
    return "{" + f",{sep}".join(f"{k}: {v}" for k, v in members) + "}"


TIMES = st.one_of(
    st.floats(0, 1e16).map(repr), st.integers(0, 2**53).map(str), st.just("4458676523247.968")
)
RARE_TIMES = st.one_of(TIMES, TIMES, TIMES, TIMES, TIMES, TIMES, GOOD_NUMBERS)


@st.composite
def device_event(draw: st.DrawFn) -> str:
    """A kernel, memory op or launch whose numbers the scanner reads into columns."""
    cat = draw(st.sampled_from(['"kernel"', '"gpu_memcpy"', '"gpu_memset"', '"cuda_runtime"']))
    members = [
        ('"ph"', '"X"'),
        ('"cat"', cat),
        ('"name"', draw(NAMES)),
        ('"pid"', str(draw(st.integers(-(2**40), 2**40)))),
        ('"tid"', str(draw(st.integers(-(2**40), 2**40)))),
        ('"ts"', draw(RARE_TIMES)),
        ('"dur"', draw(RARE_TIMES)),
        ('"args"', '{"correlation": ' + str(draw(st.integers(0, 6))) + "}"),
    ]
    members = draw(st.permutations(members))
    return "{" + ", ".join(f"{k}: {v}" for k, v in members) + "}"


@st.composite
def document(draw: st.DrawFn) -> bytes:
    kinds = st.one_of(event(), event(), device_event(), device_event(), VALUES)
    events = draw(st.lists(kinds, min_size=1, max_size=14))
    sep = draw(SPACE)
    body = '{"schemaVersion": 1, "traceEvents": [' + f",{sep}".join(events) + "]"
    tail = draw(st.sampled_from(["}", ', "traceName": "x"}', ', "deviceProperties": [{}]}']))
    raw = (body + tail).encode()
    spoil = draw(st.integers(0, 7))
    if spoil == 0:  # bytes flipped, dropped or added anywhere
        raw = mutated(raw, draw(st.randoms(use_true_random=False)), draw(st.integers(1, 3)))
    elif spoil == 1:  # one bad token in an event that may be left out
        bad = '{"ph": "X", "cat": "ac2g", "x": ' + draw(BAD_TOKENS) + "}"
        at = draw(st.integers(0, len(events)))
        spoilt = [*events[:at], bad, *events[at:]]
        raw = ('{"traceEvents": [' + ", ".join(spoilt) + "]}").encode()
    return raw


# Documents the fuzzer once found a disagreement in: events with no category link no launch.
_NO_CATEGORY = (
    b'{"schemaVersion": 1, "traceEvents": [{"ph": "X", "cat": "cuda_runtime", "name":'
    b' "ncclKernel_AllReduce_RING", "pid": 0, "tid": 0, "ts": 0.0, "dur": 0.0, "args":'
    b' {"correlation": 0}},{"args": {"correlation": 0},"dur": 0},{"args": {"correlation": 0},'
    b'"cat": "ac2g"}]}'
)
_NO_CATEGORY_ODD_ID = (
    b'{"schemaVersion": 1, "traceEvents": [{"args": {"correlation": 0},"cat": "kernel"},'
    b'{"args": {"correlation": 0.0},"dur": 0},{"ph": "X", "cat": "cuda_runtime", "name":'
    b' "ncclKernel_AllReduce_RING", "pid": 0, "tid": 0, "ts": 0.0, "dur": 4458676523247.968,'
    b' "args": {"correlation": 1}}]}'
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(document(), st.sampled_from([-1, 0]))
@example(_NO_CATEGORY, -1)
@example(_NO_CATEGORY_ODD_ID, -1)
def test_generated_documents_against_the_fallback(raw: bytes, split_min_bytes: int) -> None:
    previous = [m.set_split_min_bytes(split_min_bytes) for m in _builds()]
    try:
        check_against_fallback(raw)
    finally:
        for module, old in zip(_builds(), previous, strict=True):
            module.set_split_min_bytes(old)


@pytest.mark.usefixtures("split")
def test_deep_and_long_inputs() -> None:
    for depth in (510, 511, 512, 513, 2000):
        scanned(b'{"traceEvents": [{"cat": "kernel"}, {"cat": "ac2g", "x": ' + b"[" * depth
                + b"]" * depth + b"}]}")  # fmt: skip
    long_name = b'{"cat": "kernel", "name": "' + b"n" * 300_000 + b'", "ts": 1, "dur": 1}'
    scanned(b'{"traceEvents": [' + long_name + b', {"cat": "ac2g"}]}')
    many = b", ".join([b'{"cat": "kernel", "name": "k%d", "args": {"correlation": %d}}' % (i, i)
                       for i in range(20_000)])  # fmt: skip
    scanned(b'{"traceEvents": [' + many + b"]}")
    for raw in (b"", b"{", b'{"traceEvents"', b'{"traceEvents": [', b"\\", b'"', b"[" * 100):
        assert scanned(raw)[0] is None
