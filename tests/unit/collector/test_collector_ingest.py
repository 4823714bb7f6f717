"""Ingest over the transport-neutral HTTP API: every bad-input class, auth, limits, and fuzzing
(never a 5xx, never a state change from a refused batch)."""

from __future__ import annotations

import copy
import dataclasses
import gzip
import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from mfuscope.collector import Aggregator, StateConfig
from mfuscope.collector._ratelimit import RateLimiter
from mfuscope.collector._routes import REPORTS_PATH, HttpRequest, HttpResponse, Routes
from mfuscope.collector._snapshot import CollectorSnapshot

from tests.support.collector_fakes import FakeClock, batch_dict, report_dict

TOKEN = "s3cret-token"
COLLECTIVE = {
    "op": "all_reduce",
    "axis": "dp",
    "tier": "inter_node",
    "group_size": 4,
    "bytes": 1024,
    "count": 1,
    "seconds": 0.1,
    "overlapped_s": 0.05,
}
TOPOLOGY = {
    "groups": [
        {"axis": "tp", "tier": "intra_node", "size": 2, "spans_hosts": False},
        {"axis": "dp", "tier": "inter_node", "size": 4, "spans_hosts": True},
    ]
}


def _routes(
    *, token: str | None = None, limiter: bool = False, max_body_bytes: int = 64 * 1024
) -> tuple[Routes, Aggregator, FakeClock]:
    clock = FakeClock()
    collector = Aggregator(StateConfig(), clock=clock, max_body_bytes=max_body_bytes)
    rate = RateLimiter(2.0, 3, monotonic=clock.monotonic) if limiter else None
    return Routes(collector, token=token, rate_limiter=rate), collector, clock


def _post(
    routes: Routes,
    body: bytes,
    *,
    encoding: str = "",
    authorization: str | None = None,
    client: str = "10.0.0.1",
) -> HttpResponse:
    request = HttpRequest(
        method="POST",
        path=REPORTS_PATH,
        client=client,
        authorization=authorization,
        content_length=len(body),
        content_encoding=encoding,
    )
    return routes.before_body(request) or routes.handle(request, body)


def _json(response: HttpResponse) -> Any:
    return json.loads(response.body)


def _good(**fields: Any) -> dict[str, Any]:
    return batch_dict(
        reports=[report_dict(1, collectives=[COLLECTIVE]), report_dict(2)],
        topology=copy.deepcopy(TOPOLOGY),
        **fields,
    )


def _without_rejections(snapshot: CollectorSnapshot) -> CollectorSnapshot:
    return dataclasses.replace(snapshot, rejected=())


def _set(obj: dict[str, Any], path: str, value: Any) -> dict[str, Any]:
    target: Any = obj
    *parents, last = path.split(".")
    for key in parents:
        target = target[int(key)] if isinstance(target, list) else target[key]
    if value is _DELETE:
        del target[last]
    else:
        target[int(last) if isinstance(target, list) else last] = value
    return obj


_DELETE = object()


@pytest.mark.parametrize(
    ("path", "value", "field", "reason"),
    [
        ("version", "2.0", "version", "version"),
        ("version", "one", "version", "version"),
        ("schema", "other.report", "schema", "version"),
        ("schema", _DELETE, "schema", "invalid"),
        ("job", _DELETE, "job", "invalid"),
        ("rank", "3", "rank", "invalid"),
        ("rank", 2, "rank", "invalid"),  # not below world_size
        ("reports", {}, "reports", "invalid"),
        ("reports.0.wall_s", -1.0, "reports[0].wall_s", "invalid"),
        ("reports.0.wall_s", float("nan"), "reports[0].wall_s", "invalid"),
        ("reports.0.wall_s", 0.0, "reports[0].wall_s", "invalid"),
        ("reports.0.model_flops", float("inf"), "reports[0].model_flops", "invalid"),
        ("reports.0.components.0.seconds", 0.5, "reports[0].components", "invalid"),
        ("reports.0.collectives.0.bytes", 1 << 60, "reports[0].collectives[0].bytes", "invalid"),
        ("reports.0.collectives.0.op", "all_reduce_2", "reports[0].collectives[0].op", "invalid"),
        ("world_size", 1 << 30, "world_size", "invalid"),
        ("peak_flops", int("9" * 400), "peak_flops", "invalid"),  # too large for a float
        ("health", [], "health", "invalid"),
        ("topology.groups.0.spans_hosts", "no", "topology.groups[0].spans_hosts", "invalid"),
    ],
)
def test_bad_batches_are_400_naming_the_field_and_change_nothing(
    path: str, value: Any, field: str, reason: str
) -> None:
    routes, collector, _ = _routes()
    assert _post(routes, json.dumps(_good(job="other", steps=[1])).encode()).status == 200
    before = collector.snapshot()
    response = _post(routes, json.dumps(_set(_good(), path, value)).encode())
    assert response.status == 400
    assert _json(response)["field"] == field
    assert _json(response)["error"]
    after = collector.snapshot()
    assert _without_rejections(after) == _without_rejections(before)
    assert dict(after.rejected) == {reason: 1}


@pytest.mark.parametrize(
    ("body", "encoding", "status", "field"),
    [
        pytest.param(b"{not json", "", 400, "body", id="not-json"),
        pytest.param(b"\xff\xfe\x00", "", 400, "body", id="not-utf8"),
        pytest.param(b"[" * 100_000 + b"]" * 100_000, "", 400, "batch", id="too-deep"),
        pytest.param(
            b'{"schema":"mfuscope.report","version":"1.0","x":'
            + b"[" * 100_000
            + b"]" * 100_000
            + b"}",
            "",
            400,
            "body",
            id="too-deep-inside",
        ),
        pytest.param(b"[]", "", 400, "batch", id="not-an-object"),
        pytest.param(b"not gzip", "gzip", 400, "body", id="bad-gzip"),
        pytest.param(gzip.compress(b"{}", mtime=0)[:-4], "gzip", 400, "body", id="truncated-gzip"),
        # A 10 KB gzip bomb inflating to 10 MB: refused without inflating it all.
        pytest.param(gzip.compress(b" " * (10 << 20), mtime=0), "gzip", 413, "body", id="bomb"),
        pytest.param(b"{}", "br", 400, "content-encoding", id="unknown-encoding"),
        pytest.param(b" " * (64 * 1024 + 1), "", 413, "body", id="over-the-limit"),
    ],
)
def test_malformed_bodies(body: bytes, encoding: str, status: int, field: str) -> None:
    routes, collector, _ = _routes(max_body_bytes=256 * 1024 if status != 413 else 64 * 1024)
    response = _post(routes, body, encoding=encoding)
    assert (response.status, _json(response)["field"]) == (status, field)
    assert collector.snapshot().jobs == ()


def test_gzip_bodies_are_accepted() -> None:
    routes, _, _ = _routes()
    response = _post(routes, gzip.compress(json.dumps(_good()).encode()), encoding="gzip")
    assert (response.status, _json(response)) == (200, {"accepted": 2, "duplicates": 0})


def test_content_length_over_the_limit_is_refused_before_reading() -> None:
    routes, collector, _ = _routes(max_body_bytes=2048)
    request = HttpRequest("POST", REPORTS_PATH, "10.0.0.1", content_length=2049)
    response = routes.before_body(request)
    assert response is not None and response.status == 413
    assert dict(collector.snapshot().rejected) == {"too_large": 1}


@pytest.mark.parametrize(
    ("authorization", "status"),
    [
        (None, 401),
        ("Bearer wrong", 401),
        (f"Basic {TOKEN}", 401),
        (f"Bearer {TOKEN}x", 401),
        (f"Bearer {TOKEN}", 200),
        (f"bearer {TOKEN}", 200),  # the scheme is case-insensitive (RFC 7235)
    ],
)
def test_bearer_token(authorization: str | None, status: int) -> None:
    routes, collector, _ = _routes(token=TOKEN)
    response = _post(routes, json.dumps(_good()).encode(), authorization=authorization)
    assert response.status == status
    if status == 401:
        assert _json(response)["field"] == "authorization"
        assert collector.snapshot().jobs == ()


def test_rate_limit_per_client_with_retry_after() -> None:
    routes, collector, clock = _routes(limiter=True)  # 2/s, burst 3
    body = json.dumps(_good()).encode()
    statuses = [_post(routes, body).status for _ in range(4)]
    assert statuses == [200, 200, 200, 429]
    limited = _post(routes, body)
    assert dict(limited.headers)["Retry-After"] == "1"
    assert _json(limited)["field"] == "client"
    assert _post(routes, body, client="10.0.0.2").status == 200  # other clients unaffected
    clock.advance(0.5)
    assert _post(routes, body).status == 200  # one token refilled
    assert dict(collector.snapshot().rejected) == {"rate_limited": 2}


def test_rate_limit_applies_before_the_token_check() -> None:
    """A client without the token is throttled like any other: past its burst it gets 429, not
    401, so a flood from anyone who can reach the port costs a token-bucket lookup each."""
    routes, collector, _ = _routes(token=TOKEN, limiter=True)  # 2/s, burst 3
    body = json.dumps(_good()).encode()
    statuses = [_post(routes, body, authorization="Bearer wrong").status for _ in range(5)]
    assert statuses == [401, 401, 401, 429, 429]
    assert dict(collector.snapshot().rejected) == {"unauthorized": 3, "rate_limited": 2}
    # The limit is per client: an agent elsewhere with the token is unaffected.
    good = _post(routes, body, authorization=f"Bearer {TOKEN}", client="10.0.0.2")
    assert good.status == 200


@pytest.mark.parametrize(
    ("method", "path", "status"),
    [
        ("GET", REPORTS_PATH, 405),
        ("POST", "/metrics", 405),
        ("GET", "/nope", 404),
        ("GET", "/healthz", 200),
        ("GET", "/v1/summary", 200),
        ("GET", "/metrics", 200),
    ],
)
def test_routing(method: str, path: str, status: int) -> None:
    routes, _, _ = _routes()
    request = HttpRequest(method, path, "127.0.0.1")
    response = routes.before_body(request) or routes.handle(request, b"")
    assert response.status == status


# --- fuzzing --------------------------------------------------------------------------------------

_json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(1 << 70), max_value=1 << 70)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=300),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=12), children, max_size=4)
    ),
    max_leaves=12,
)


def _paths(obj: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [prefix]
    if isinstance(obj, dict):
        for key, value in obj.items():
            out += _paths(value, (*prefix, key))
    elif isinstance(obj, list):
        for i, value in enumerate(obj):
            out += _paths(value, (*prefix, i))
    return out


@st.composite
def _mutated_batch(draw: st.DrawFn) -> bytes:
    batch = _good()
    for _ in range(draw(st.integers(1, 3))):
        paths = _paths(batch)[1:]
        if not paths:
            break
        path = draw(st.sampled_from(paths))
        parent: Any = batch
        for key in path[:-1]:
            parent = parent[key]
        if draw(st.booleans()):
            del parent[path[-1]]
        else:
            parent[path[-1]] = draw(_json_values)
    return json.dumps(batch, allow_nan=True).encode()


_bodies = st.one_of(
    st.binary(max_size=200),
    _json_values.map(lambda v: json.dumps(v, allow_nan=True).encode()),
    _mutated_batch(),
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(body=_bodies, gz=st.booleans())
def test_fuzzed_bodies_never_5xx_and_refusals_change_nothing(body: bytes, gz: bool) -> None:
    routes, collector, _ = _routes()
    assert _post(routes, json.dumps(_good(job="seed")).encode()).status == 200
    before = collector.snapshot()
    response = _post(routes, gzip.compress(body) if gz else body, encoding="gzip" if gz else "")
    assert response.status in (200, 400, 413)
    payload = _json(response)
    if response.status == 200:
        assert set(payload) == {"accepted", "duplicates"}
    else:
        assert set(payload) == {"error", "field"}
        after = collector.snapshot()
        assert _without_rejections(after) == _without_rejections(before)
        assert sum(n for _, n in after.rejected) == 1


def test_rate_limit_is_checked_before_the_token() -> None:
    routes, collector, _ = _routes(token=TOKEN, limiter=True)  # 2/s, burst 3
    body = json.dumps(_good()).encode()
    statuses = [_post(routes, body, authorization="Bearer nope").status for _ in range(4)]
    assert statuses == [401, 401, 401, 429]
    assert dict(collector.snapshot().rejected) == {"unauthorized": 3, "rate_limited": 1}


@pytest.mark.parametrize(
    "content_type", ["", "text/plain", "application/x-www-form-urlencoded", "application/jsonx"]
)
def test_only_json_bodies_are_accepted(content_type: str) -> None:
    routes, collector, _ = _routes()
    request = HttpRequest("POST", REPORTS_PATH, "10.0.0.1", content_type=content_type)
    response = routes.before_body(request)
    assert response is not None and response.status == 415
    assert _json(response)["field"] == "content-type"
    assert dict(collector.snapshot().rejected) == {"content_type": 1}


def test_json_with_a_charset_parameter_is_accepted() -> None:
    routes, _, _ = _routes()
    request = HttpRequest(
        "POST", REPORTS_PATH, "10.0.0.1", content_type="Application/JSON; charset=utf-8"
    )
    assert routes.before_body(request) is None


def test_data_after_the_gzip_member_is_refused() -> None:
    routes, collector, _ = _routes()
    body = gzip.compress(json.dumps(_good()).encode()) + b"garbage"
    response = _post(routes, body, encoding="gzip")
    assert (response.status, _json(response)["field"]) == (400, "body")
    assert collector.snapshot().jobs == ()


def _limited(**limits: int) -> tuple[Routes, Aggregator, FakeClock]:
    clock = FakeClock()
    collector = Aggregator(StateConfig(expire_after_s=60.0, **limits), clock=clock)
    return Routes(collector), collector, clock


def test_job_limit_refuses_new_jobs_until_one_expires() -> None:
    routes, collector, clock = _limited(max_jobs=2)
    for job in ("a", "b"):
        assert _post(routes, json.dumps(batch_dict(job=job)).encode()).status == 200
    refused = _post(routes, json.dumps(batch_dict(job="c")).encode())
    assert (refused.status, _json(refused)["field"]) == (429, "job")
    assert dict(refused.headers)["Retry-After"] == "60"
    assert _post(routes, json.dumps(batch_dict(job="a", steps=[9])).encode()).status == 200
    clock.advance(61)
    assert _post(routes, json.dumps(batch_dict(job="c")).encode()).status == 200
    assert dict(collector.snapshot().rejected) == {"too_many_jobs": 1}


def test_rank_limit_per_job() -> None:
    routes, collector, _ = _limited(max_ranks_per_job=2)
    for rank in (0, 1):
        body = json.dumps(batch_dict(rank=rank, world_size=4)).encode()
        assert _post(routes, body).status == 200
    refused = _post(routes, json.dumps(batch_dict(rank=2, world_size=4)).encode())
    assert (refused.status, _json(refused)["field"]) == (429, "rank")
    assert collector.snapshot().jobs[0].live_ranks == 2
    assert dict(collector.snapshot().rejected) == {"too_many_ranks": 1}


def test_axis_limit_per_job_changes_nothing() -> None:
    routes, collector, _ = _limited(max_axes_per_job=3)
    assert _post(routes, json.dumps(_good()).encode()).status == 200  # dp, tp
    before = collector.snapshot().jobs
    many = [report_dict(10 + i, collectives=[{**COLLECTIVE, "axis": f"axis{i}"}]) for i in range(2)]
    refused = _post(routes, json.dumps(batch_dict(reports=many)).encode())
    assert (refused.status, _json(refused)["field"]) == (400, "axis")
    assert collector.snapshot().jobs == before
    assert dict(collector.snapshot().rejected) == {"too_many_axes": 1}
