"""Hypothesis against the typed decoder, from a full schema-1.2 body (every record: comm,
hardware, topology, class split): whatever a client sends, the collector answers 200 or a 4xx
naming one field on one line, never a 5xx, and a refused batch changes nothing."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from mfuscope.collector import Aggregator, StateConfig
from mfuscope.collector._routes import REPORTS_PATH, HttpRequest, Routes
from mfuscope.collector._snapshot import CollectorSnapshot
from mfuscope.core.schema import SchemaError, decode_batch

from tests.support.collector_fakes import FakeClock

BODY = (Path(__file__).parents[2] / "data" / "wire" / "batch-1.2.json").read_bytes()

_leaves = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(1 << 70), max_value=1 << 70)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.sampled_from(["", "dp", "all_reduce", "unknown", "\ud800", "x" * 300, "1.2", "2.0"])
    | st.text(max_size=20)
)
_values = st.recursive(
    _leaves,
    lambda children: (
        st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=8), children)
    ),
    max_leaves=8,
)


def _paths(obj: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [prefix]
    items = (
        obj.items() if isinstance(obj, dict) else enumerate(obj) if isinstance(obj, list) else ()
    )
    for key, value in items:
        out += _paths(value, (*prefix, key))
    return out


@st.composite
def _mutated(draw: st.DrawFn) -> bytes:
    """The recorded body with a few values replaced, removed, or repeated in lists."""
    batch = json.loads(BODY)
    for _ in range(draw(st.integers(1, 3))):
        path = draw(st.sampled_from(_paths(batch)[1:]))
        parent: Any = batch
        for key in path[:-1]:
            parent = parent[key]
        action = draw(st.sampled_from(["set", "delete", "repeat"]))
        if action == "delete":
            del parent[path[-1]]
        elif action == "repeat" and isinstance(parent, list):
            parent.append(parent[path[-1]])
        else:
            parent[path[-1]] = draw(_values)
    return json.dumps(batch, allow_nan=True).encode()


@st.composite
def _spliced(draw: st.DrawFn) -> bytes:
    """The recorded body with a run of bytes overwritten, cut or inserted."""
    start = draw(st.integers(0, len(BODY)))
    cut = draw(st.integers(0, 8))
    return BODY[:start] + draw(st.binary(max_size=8)) + BODY[start + cut :]


def _post(routes: Routes, body: bytes) -> tuple[int, dict[str, Any]]:
    request = HttpRequest(
        method="POST",
        path=REPORTS_PATH,
        client="10.0.0.1",
        authorization=None,
        content_length=len(body),
        content_encoding="",
    )
    response = routes.before_body(request) or routes.handle(request, body)
    return response.status, json.loads(response.body)


def _unrejected(snapshot: CollectorSnapshot) -> CollectorSnapshot:
    return dataclasses.replace(snapshot, rejected=())


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(body=st.one_of(_mutated(), _spliced()))
def test_fuzzed_bodies_are_accepted_or_refused_on_one_field(body: bytes) -> None:
    collector = Aggregator(StateConfig(), clock=FakeClock(), max_body_bytes=64 * 1024)
    routes = Routes(collector)
    seed = BODY.replace(b'"llama-8b"', b'"seed"')
    assert _post(routes, seed)[0] == 200
    before = collector.snapshot()
    status, payload = _post(routes, body)
    assert status in (200, 400)
    try:
        decode_batch(body)
    except SchemaError as exc:
        assert status == 400
        assert payload == {"error": exc.message, "field": exc.field}
        assert "\n" not in exc.message and exc.field
        assert _unrejected(collector.snapshot()) == _unrejected(before)
    else:
        assert status == 200


def test_the_recorded_body_is_accepted() -> None:
    routes = Routes(Aggregator(StateConfig(), clock=FakeClock(), max_body_bytes=64 * 1024))
    assert _post(routes, BODY) == (200, {"accepted": 2, "duplicates": 0})
