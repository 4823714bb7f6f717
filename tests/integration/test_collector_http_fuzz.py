"""Hypothesis against the real HTTP server (aiohttp, in-process on port 0): malformed bodies and
headers never get a 5xx, and a refused request never changes what the collector reports."""

from __future__ import annotations

import asyncio
import gzip
import http.client
import json
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from mfuscope.collector import Aggregator, StateConfig
from mfuscope.collector._routes import Routes
from mfuscope.collector._server import bind_socket, serve_until

from tests.support.collector_fakes import FakeClock, batch_dict

pytestmark = pytest.mark.slow


class Server:
    def __init__(self) -> None:
        self.collector = Aggregator(StateConfig(), clock=FakeClock(), max_body_bytes=64 * 1024)
        self.loop = asyncio.new_event_loop()
        self.stop = asyncio.Event()
        started = threading.Event()
        self.address: tuple[str, int] = ("", 0)

        def on_started(address: tuple[str, int]) -> None:
            self.address = address
            started.set()

        coroutine = serve_until(
            Routes(self.collector, token="tok"), bind_socket("127.0.0.1", 0), self.stop, on_started
        )
        self.thread = threading.Thread(target=self.loop.run_until_complete, args=(coroutine,))
        self.thread.start()
        assert started.wait(30)

    def request(
        self, method: str, path: str, body: bytes = b"", headers: dict[str, str] | None = None
    ) -> tuple[int, bytes]:
        connection = http.client.HTTPConnection(*self.address, timeout=30)
        try:
            connection.request(method, path, body=body, headers=headers or {})
            response = connection.getresponse()
            return response.status, response.read()
        finally:
            connection.close()

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.stop.set)
        self.thread.join(30)
        self.loop.close()


@pytest.fixture(scope="module")
def server() -> Iterator[Server]:
    s = Server()
    ok = s.request(
        "POST",
        "/v1/reports",
        json.dumps(batch_dict()).encode(),
        {"Authorization": "Bearer tok", "Content-Type": "application/json"},
    )
    assert ok[0] == 200
    yield s
    s.close()


def _state(server: Server) -> Any:
    status, body = server.request("GET", "/v1/summary")
    assert status == 200
    doc = json.loads(body)
    doc.pop("rejected")
    return doc


_header_values = st.text(
    alphabet=st.characters(min_codepoint=0x20, max_codepoint=0x7E), max_size=40
)


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    body=st.one_of(
        st.binary(max_size=300),
        st.builds(lambda b: gzip.compress(b), st.binary(max_size=300)),
        st.builds(lambda n: b"{" * n, st.integers(1, 70_000)),
    ),
    encoding=st.sampled_from(["", "gzip", "identity", "deflate"]) | _header_values,
    authorization=st.sampled_from(["Bearer tok", "Bearer", ""]) | _header_values,
    path=st.sampled_from(["/v1/reports", "/v1/reports/", "/metrics", "/v1/summary?x=1"]),
    method=st.sampled_from(["POST", "GET", "PUT", "DELETE"]),
    content_type=st.sampled_from(["application/json", "text/plain"]) | _header_values,
)
def test_never_a_5xx_and_refusals_change_nothing(
    server: Server,
    body: bytes,
    encoding: str,
    authorization: str,
    path: str,
    method: str,
    content_type: str,
) -> None:
    before = _state(server)
    headers = {
        "Content-Encoding": encoding,
        "Authorization": authorization,
        "Content-Type": content_type,
    }
    status, payload = server.request(method, path, body, headers)
    assert status < 500, payload
    if status != 200 or path != "/v1/reports":
        assert _state(server) == before
