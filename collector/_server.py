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

Slow and idle clients are bounded (`ServerLimits`, docs/collector.md): a connection has
`header_timeout_s` to deliver a request's headers (from the connection's start, and again after
each response), then `body_timeout_s` for its body, else it is closed; connections beyond
`max_connections` are closed as soon as they are accepted. aiohttp alone has no header timeout
(its keep-alive timer stops at the first byte), so without these a few thousand connections that
never finish their headers hold every file descriptor, and real agents time out.
"""

from __future__ import annotations

import asyncio
import itertools
import math
import socket
import struct
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

try:  # POSIX: how much a waiting connection has sent (without them, eviction is by age alone)
    import fcntl
    import termios
except ImportError:  # pragma: no cover - not on Linux
    fcntl = termios = None  # type: ignore[assignment]

from aiohttp import web
from aiohttp.web_protocol import RequestHandler
from mfuscope.collector._errors import PayloadTooLarge
from mfuscope.collector._routes import REPORTS_PATH, HttpRequest, HttpResponse, Routes

__all__ = ["CollectorServer", "ServerLimits", "bind_socket", "serve_until"]

_BODY_CHUNK_BYTES = 64 * 1024
# Waiting connections looked at for one to evict at the connection cap (a bound on the work).
_EVICTION_CANDIDATES = 16


def _unread_bytes(handler: RequestHandler) -> int:
    """Bytes received on `handler`'s socket that nothing has read yet (-1: unknown, e.g. a
    platform without ``FIONREAD``)."""
    transport = handler.transport
    sock = None if transport is None else transport.get_extra_info("socket")
    if sock is None or termios is None or fcntl is None:
        return -1
    try:
        raw = fcntl.ioctl(sock.fileno(), termios.FIONREAD, b"\0\0\0\0")
    except (OSError, ValueError):
        return -1
    unread: int = struct.unpack("i", raw)[0]
    return unread


@dataclass(frozen=True)
class ServerLimits:
    """Bounds on what one client can hold. `header_timeout_s`: seconds a connection has to send a
    request's headers (from its start, and after each response); `body_timeout_s`: seconds to send
    the body once the headers are in; `max_connections`: open connections at once (keep it well
    below the process's open-file limit)."""

    header_timeout_s: float = 10.0
    body_timeout_s: float = 30.0
    max_connections: int = 512

    def __post_init__(self) -> None:
        for name in ("header_timeout_s", "body_timeout_s"):
            value = getattr(self, name)
            if not (value > 0 and math.isfinite(value)):
                raise ValueError(f"{name} must be a positive number of seconds, got {value}")
        if self.max_connections < 1:
            raise ValueError(f"max_connections must be >= 1, got {self.max_connections}")


class _GuardedServer(web.Server):
    """aiohttp's low-level server with a connection cap and a per-connection header deadline.

    At the cap, the connection that has waited longest for its next request's headers is closed
    to make room (a real agent sends its headers within milliseconds of connecting, so the
    connections that sit waiting are the idle and the slow); only when every open connection is
    busy in a handler is the new one closed instead."""

    def __init__(
        self,
        handler: Callable[[web.BaseRequest], Awaitable[web.StreamResponse]],
        limits: ServerLimits,
        **kwargs: Any,
    ) -> None:
        super().__init__(handler, **kwargs)
        self._limits = limits
        self._admitted: set[RequestHandler] = set()
        # Admitted connections waiting for headers, oldest wait first -> the timer closing them.
        self._waiting: OrderedDict[RequestHandler, asyncio.TimerHandle] = OrderedDict()

    @property
    def open_connections(self) -> int:
        return len(self._admitted)

    def connection_made(self, handler: RequestHandler, transport: asyncio.Transport) -> None:
        super().connection_made(handler, transport)
        # Close on the next loop turn, once aiohttp has finished setting the connection up
        # (closing it right here races its start-up).
        loop = asyncio.get_running_loop()
        if len(self._admitted) >= self._limits.max_connections:
            idle = self._idle_waiting()
            if idle is None:  # everyone is busy or has a request on the way: refuse the newcomer
                loop.call_soon(handler.force_close)
                return
            self._waiting.pop(idle).cancel()
            self._admitted.discard(idle)
            loop.call_soon(idle.force_close)
        self._admitted.add(handler)
        self.expect_headers(handler)

    def _idle_waiting(self) -> RequestHandler | None:
        """The longest-waiting connection with nothing unread in the kernel, among the first few:
        an idle or slow client. Under a burst of real agents the connections waiting for their
        turn have their requests already received but not yet read; evicting those to admit
        newer ones closed request after request before any was served (at 8,192 ranks, 35
        batches in 20 s). Refusing the newcomer instead, its agent retries after its backoff."""
        for handler in itertools.islice(self._waiting, _EVICTION_CANDIDATES):
            if _unread_bytes(handler) <= 0:
                return handler
        return None

    def connection_lost(self, handler: RequestHandler, exc: BaseException | None = None) -> None:
        self.headers_received(handler)
        self._admitted.discard(handler)
        super().connection_lost(handler, exc)

    def expect_headers(self, handler: RequestHandler) -> None:
        """(Re)start `handler`'s header deadline: the next request must arrive in time."""
        if handler not in self._admitted:
            return
        self.headers_received(handler)
        loop = asyncio.get_running_loop()
        self._waiting[handler] = loop.call_later(self._limits.header_timeout_s, handler.force_close)

    def headers_received(self, handler: RequestHandler) -> None:
        """Stop `handler`'s header deadline: a request is being handled."""
        timer = self._waiting.pop(handler, None)
        if timer is not None:
            timer.cancel()


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


async def _answer_and_close(request: web.BaseRequest, response: web.Response) -> web.Response:
    """Send `response`, then close the connection at once: the rest of the body is still on the
    wire, and aiohttp would otherwise keep reading ("lingering") it for up to 10 s."""
    response.force_close()
    await response.prepare(request)
    await response.write_eof()
    request.protocol.force_close()
    return response


class CollectorServer:
    """Serve `routes` on an already bound socket. `start` returns once accepting; `stop` closes."""

    def __init__(
        self, routes: Routes, sock: socket.socket, limits: ServerLimits | None = None
    ) -> None:
        self._routes = routes
        self._sock = sock
        self._limits = limits or ServerLimits()
        self._server: _GuardedServer | None = None
        self._runner: web.BaseRunner | None = None

    @property
    def open_connections(self) -> int:
        """Connections currently admitted (for tests and diagnostics)."""
        return 0 if self._server is None else self._server.open_connections

    @property
    def address(self) -> tuple[str, int]:
        host, port = self._sock.getsockname()[:2]
        return str(host), int(port)

    async def start(self) -> None:
        self._server = _GuardedServer(
            self._handle, self._limits, access_log=None, auto_decompress=False
        )
        self._runner = web.ServerRunner(self._server, shutdown_timeout=5.0)
        await self._runner.setup()
        await web.SockSite(self._runner, self._sock, backlog=1024).start()

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    async def _read_body(self, request: web.BaseRequest) -> bytes:
        """The body, at most `max_body_bytes` (else `PayloadTooLarge`), within the body timeout
        (else `TimeoutError`)."""
        limit = self._routes.max_body_bytes
        body = bytearray()
        async with asyncio.timeout(self._limits.body_timeout_s):
            while chunk := await request.content.read(_BODY_CHUNK_BYTES):
                body += chunk
                if len(body) > limit:
                    raise PayloadTooLarge("body", f"body is over {limit} bytes")
        return bytes(body)

    async def _handle(self, request: web.BaseRequest) -> web.StreamResponse:
        assert self._server is not None
        self._server.headers_received(request.protocol)
        try:
            return await self._respond(request)
        finally:
            self._server.expect_headers(request.protocol)

    async def _respond(self, request: web.BaseRequest) -> web.StreamResponse:
        req = HttpRequest(
            method=request.method,
            path=request.path,
            client=request.remote or "",
            authorization=request.headers.get("Authorization"),
            content_length=request.content_length,
            content_encoding=request.headers.get("Content-Encoding", ""),
            accept=request.headers.get("Accept", ""),
            content_type=request.headers.get("Content-Type", ""),
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
            body = await self._read_body(request)
        except PayloadTooLarge as error:
            return await _answer_and_close(request, _response(self._routes.refuse(error)))
        except TimeoutError:
            timed_out = HttpResponse(408, b'{"error":"body not received in time","field":"body"}')
            return await _answer_and_close(request, _response(timed_out))
        return _response(self._routes.handle(req, body))


async def serve_until(
    routes: Routes,
    sock: socket.socket,
    stop: asyncio.Event,
    on_started: Callable[[tuple[str, int]], None],
    limits: ServerLimits | None = None,
) -> None:
    """Serve until `stop` is set; `on_started(address)` runs once the socket accepts."""
    server = CollectorServer(routes, sock, limits)
    await server.start()
    try:
        on_started(server.address)
        await stop.wait()
    finally:
        await server.stop()
