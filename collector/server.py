"""The HTTP server: `Routes` carried by aiohttp, on one asyncio event loop.

Why aiohttp rather than the standard library's ThreadingHTTPServer: on
`benchmarks/collector_load.py` (4,096 ranks, one fresh connection per batch, same `Routes`) both
used about the same CPU per report, but aiohttp's p99 ingest latency was 12-14 ms against 42-53 ms,
and in one run on a briefly overloaded machine the thread-per-connection server grew to 6,361
threads and stopped answering, while an event loop's footprint stays flat under overload
(docs/collector.md has the numbers). One event loop thread also makes every ingest atomic by
construction; the `Aggregator` lock is there for renders and the OTLP pusher, which run on threads.

aiohttp's automatic request decompression is off: `decode_batch` inflates gzip itself with a hard
output limit, so the limit means the same with and without compression.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Callable

from aiohttp import web
from mfuscope.collector.errors import PayloadTooLarge
from mfuscope.collector.routes import REPORTS_PATH, HttpRequest, HttpResponse, Routes

__all__ = ["CollectorServer", "bind_socket", "serve_until"]


def bind_socket(host: str, port: int) -> socket.socket:
    """A listening TCP socket on `host`:`port` (port 0: any free port), IPv4 or IPv6."""
    family = socket.AF_INET6 if ":" in host.strip("[]") else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host.strip("[]"), port))
        sock.listen(1024)
        sock.setblocking(False)
    except OSError:
        sock.close()
        raise
    return sock


def _response(response: HttpResponse) -> web.Response:
    content_type, _, params = response.content_type.partition(";")
    charset = None
    for param in params.split(";"):
        key, _, value = param.strip().partition("=")
        if key == "charset":
            charset = value
    resp = web.Response(status=response.status, body=response.body, charset=charset)
    # Set the full header (it may carry version/escaping parameters Prometheus reads).
    resp.headers["Content-Type"] = response.content_type if params else content_type
    for name, value in response.headers:
        resp.headers[name] = value
    return resp


class CollectorServer:
    """Serve `routes` on an already bound socket. `start` returns once accepting; `stop` closes."""

    def __init__(self, routes: Routes, sock: socket.socket) -> None:
        self._routes = routes
        self._sock = sock
        app = web.Application(client_max_size=routes.max_body_bytes)
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._runner = web.AppRunner(
            app, access_log=None, auto_decompress=False, shutdown_timeout=5.0
        )

    @property
    def address(self) -> tuple[str, int]:
        host, port = self._sock.getsockname()[:2]
        return str(host), int(port)

    async def start(self) -> None:
        await self._runner.setup()
        await web.SockSite(self._runner, self._sock).start()

    async def stop(self) -> None:
        await self._runner.cleanup()

    async def _handle(self, request: web.Request) -> web.Response:
        req = HttpRequest(
            method=request.method,
            path=request.path,
            client=request.remote or "",
            authorization=request.headers.get("Authorization"),
            content_length=request.content_length,
            content_encoding=request.headers.get("Content-Encoding", ""),
            accept=request.headers.get("Accept", ""),
        )
        early = self._routes.before_body(req)
        if early is not None:
            return _response(early)
        if req.path != REPORTS_PATH:
            # Scrapes and summaries render off the event loop: with per-rank labels a scrape of
            # thousands of ranks takes seconds, and ingest must not stall behind it (the state
            # lock is held only while the snapshot is taken).
            loop = asyncio.get_running_loop()
            return _response(await loop.run_in_executor(None, self._routes.handle, req, b""))
        try:
            body = await request.read()
        except web.HTTPRequestEntityTooLarge:
            error = PayloadTooLarge("body", f"body is over {self._routes.max_body_bytes} bytes")
            return _response(self._routes.refuse(error))
        return _response(self._routes.handle(req, body))


async def serve_until(
    routes: Routes,
    sock: socket.socket,
    stop: asyncio.Event,
    on_started: Callable[[tuple[str, int]], None],
) -> None:
    """Serve until `stop` is set; `on_started(address)` runs once the socket accepts."""
    server = CollectorServer(routes, sock)
    await server.start()
    try:
        on_started(server.address)
        await stop.wait()
    finally:
        await server.stop()
