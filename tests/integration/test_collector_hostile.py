"""A careless or hostile client against a real `mfuscope collector` process: no batch can make
`/metrics` or `/v1/summary` answer 5xx or export a non-finite value, and slow or idle connections
are closed at the documented timeouts, a connection cap keeping the rest of the clients served."""

from __future__ import annotations

import json
import math
import select
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.support.collector_fakes import batch_dict, report_dict
from tests.support.collector_process import CollectorProcess, post, request
from tests.support.waiting import wait_until

pytestmark = pytest.mark.slow

HEADER_TIMEOUT_S = 1.0
BODY_TIMEOUT_S = 1.0
MAX_CONNECTIONS = 16


@pytest.fixture(scope="module")
def collector(tmp_path_factory: pytest.TempPathFactory) -> Iterator[CollectorProcess]:
    process = CollectorProcess(
        tmp_path_factory.mktemp("hostile"),
        "--rate-limit",
        "0",
        "--header-timeout",
        str(HEADER_TIMEOUT_S),
        "--body-timeout",
        str(BODY_TIMEOUT_S),
        "--max-connections",
        str(MAX_CONNECTIONS),
    )
    yield process
    code, _, err = process.stop()
    assert code == 0, err
    assert "Traceback" not in err, err


def _assert_reads_are_healthy(url: str) -> None:
    """Both exposition formats and the summary answer 200 with finite values only."""
    for accept in ("", "application/openmetrics-text; version=1.0.0"):
        status, _, body = request(url + "/metrics", headers={"Accept": accept})
        assert status == 200, body[:300]
        for line in body.decode().splitlines():
            if line.startswith("#") or 'le="+Inf"' in line or not line:
                continue
            value = line.rsplit(" ", 1)[-1] if accept == "" else line.split(" ")[-1]
            assert math.isfinite(float(value)), line
    status, _, body = request(url + "/v1/summary")
    assert status == 200, body[:300]
    json.loads(body)  # strict JSON: no NaN or Infinity


_SURROGATES = st.sampled_from(["\ud800", "\udfff", "\udce9", "\udbff\udbff"])
_hostile_text = st.one_of(
    st.text(max_size=12),
    st.builds(lambda a, s, b: a + s + b, st.text(max_size=6), _SURROGATES, st.text(max_size=6)),
    st.sampled_from(["caf\udce9-run", "", "x" * 257, 'a"b\\nc{}', "\x00"]),
)
_hostile_number = st.one_of(
    st.floats(allow_nan=False, allow_infinity=False),
    st.sampled_from([1e-300, 5e-324, 1e-7, 1e-10, 1e308, -0.0, 86_400.0, 0.0]),
    st.integers(min_value=-(10**30), max_value=10**30),
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    job=_hostile_text,
    axis=_hostile_text,
    host=_hostile_text,
    wall_s=_hostile_number,
    model_flops=_hostile_number,
    overlapped=_hostile_number,
    seconds=_hostile_number,
    peak=_hostile_number,
    version=st.sampled_from(["1.0", "1.1", "1.\u00b2", "\u0661.0", "1.0.0"]),
)
def test_no_batch_breaks_metrics_or_summary(
    collector: CollectorProcess,
    job: str,
    axis: str,
    host: str,
    wall_s: Any,
    model_flops: Any,
    overlapped: Any,
    seconds: Any,
    peak: Any,
    version: str,
) -> None:
    collective = {
        "op": "all_reduce",
        "axis": axis,
        "tier": "inter_node",
        "group_size": 2,
        "bytes": 1 << 40,
        "count": 1,
        "seconds": seconds,
        "overlapped_s": 0.0,
    }
    report = report_dict(1, wall_s=1.0, model_flops=1e9, collectives=[collective])
    report.update(wall_s=wall_s, model_flops=model_flops, overlapped_comm_s=overlapped)
    report["components"] = []
    batch = batch_dict(job=job, host=host, reports=[report], peak_flops=peak, version=version)
    status, answer = post(collector.url, json.dumps(batch).encode())  # \\ud800 escapes stay
    assert status < 500, answer
    if status != 200:
        assert set(answer) == {"error", "field"} and answer["field"], answer
    _assert_reads_are_healthy(collector.url)


def test_lone_surrogates_are_refused_naming_the_field(collector: CollectorProcess) -> None:
    for field, value in (("job", "caf\udce9-run"), ("host", "\ud800"), ("device", "a\udfff")):
        status, answer = post(collector.url, batch_dict(**{field: value}))
        assert (status, answer["field"]) == (400, field), answer
    _assert_reads_are_healthy(collector.url)


def _closed_after(sock: socket.socket, limit_s: float) -> float | None:
    """Seconds until the server closes `sock` (reading and discarding any answer), or None if
    it is still open after `limit_s`."""
    started = time.monotonic()
    sock.settimeout(0.05)
    while time.monotonic() - started < limit_s:
        try:
            if sock.recv(65536) == b"":
                return time.monotonic() - started
        except TimeoutError:
            continue
        except ConnectionResetError:
            return time.monotonic() - started
    return None


def _closed_now(sock: socket.socket) -> bool:
    """Whether the server has closed `sock` by now (without waiting: 48 sockets polled with a
    recv timeout each took most of the connection-cap test)."""
    readable, _, _ = select.select([sock], [], [], 0)
    if not readable:
        return False
    try:
        return sock.recv(65536) == b""
    except ConnectionResetError:
        return True


def _connect(collector: CollectorProcess) -> socket.socket:
    host, port = collector.address.rsplit(":", 1)
    return socket.create_connection((host, int(port)), timeout=5)


def test_half_sent_headers_are_dropped_at_the_header_timeout(collector: CollectorProcess) -> None:
    with _connect(collector) as sock:
        sock.sendall(b"POST /v1/reports HTTP/1.1\r\nHost: x\r\n")
        held = _closed_after(sock, 10 * HEADER_TIMEOUT_S)
    # Closed, and not before the timeout. How late after it depends on the machine's load, so
    # the only upper bound is the 10x wait (a timer in the wrong unit, or none, fails it).
    assert held is not None and held >= HEADER_TIMEOUT_S * 0.8


def test_a_connection_that_sends_nothing_is_dropped_at_the_header_timeout(
    collector: CollectorProcess,
) -> None:
    with _connect(collector) as sock:
        held = _closed_after(sock, 10 * HEADER_TIMEOUT_S)
    assert held is not None and held >= HEADER_TIMEOUT_S * 0.8  # as for half-sent headers


def test_trickled_headers_are_dropped_at_the_header_timeout(collector: CollectorProcess) -> None:
    with _connect(collector) as sock:
        started = time.monotonic()
        closed = False
        for byte in b"POST /v1/reports HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"y" * 100:
            try:
                sock.sendall(bytes([byte]))
            except OSError:
                closed = True
                break
            if _closed_after(sock, 0.1) is not None:
                closed = True
                break
    # Closed while the client was still trickling (100+ bytes at >= 0.1 s each: a timer that
    # restarts at every byte would never fire), and not before the timeout.
    assert closed and time.monotonic() - started >= HEADER_TIMEOUT_S * 0.8


def test_a_half_sent_body_is_answered_408_at_the_body_timeout(collector: CollectorProcess) -> None:
    with _connect(collector) as sock:
        sock.sendall(
            b"POST /v1/reports HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b'Content-Length: 1000\r\n\r\n{"schema"'
        )
        started = time.monotonic()
        answer = b""
        sock.settimeout(10 * BODY_TIMEOUT_S)  # a missing or wrong-unit timer fails here
        while chunk := sock.recv(65536):
            answer += chunk
        held = time.monotonic() - started
    assert answer.startswith(b"HTTP/1.1 408"), answer[:100]  # answered, then closed
    assert held >= BODY_TIMEOUT_S * 0.8  # not before the timeout; how late depends on load


def test_the_connection_cap_evicts_idle_connections_for_real_clients(tmp_path: Path) -> None:
    # Its own collector, with a long header timeout: the idle connections then outlive any wait
    # for the client under load, so the client being answered while some of them are still open
    # shows it was served by evicting one, not after they timed out.
    header_timeout_s = 10.0
    collector = CollectorProcess(
        tmp_path,
        *("--rate-limit", "0", "--header-timeout", str(header_timeout_s)),
        *("--max-connections", str(MAX_CONNECTIONS)),
    )
    idle = [_connect(collector) for _ in range(3 * MAX_CONNECTIONS)]
    try:

        def still_open() -> list[socket.socket]:
            return [s for s in idle if not _closed_now(s)]

        wait_until(
            lambda: len(still_open()) <= MAX_CONNECTIONS, "the cap to close the connections over it"
        )
        holding = still_open()
        # A real client is served at once: the longest-idle connection makes room for it.
        assert post(collector.url, batch_dict(job="during-the-flood"))[0] == 200
        assert still_open(), "served only once every idle connection had timed out"
        assert len(still_open()) < len(holding)  # one of those held made room
        # (That idle connections go at the header timeout is the test above's, at 1 s.)
    finally:
        for s in idle:
            s.close()
        code, _, err = collector.stop()
    assert code == 0, err
