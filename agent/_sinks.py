"""Where encoded report batches go: the collector over HTTP, or a local JSONL file.

A sink sends one encoded batch (the schema's wire JSON) and raises `SendError` on failure, saying
whether a retry can help. Sinks are used from the transport's background thread only.
"""

from __future__ import annotations

import email.utils
import gzip
import http.client
import io
import json
import os
import socket
import threading
import time
import urllib.parse
from typing import Any, Protocol

from mfuscope.core.errors import MfuscopeError

__all__ = ["REPORTS_PATH", "HttpSink", "JsonlSink", "SendError", "Sink"]

REPORTS_PATH = "/v1/reports"
# Compress bodies above this size: a batch of a few hundred step reports is tens of kB of JSON.
GZIP_MIN_BYTES = 4096
# Statuses worth a retry: throttling and server-side trouble. 400/401/413 will not get better.
_RETRYABLE_STATUS = frozenset({408, 425, 429, 500, 502, 503, 504})


class SendError(MfuscopeError):
    """A batch that did not arrive. `retryable` says whether sending it again can help;
    `retry_after_s` is how long the collector asked to wait (``Retry-After``), if it did."""

    def __init__(
        self,
        message: str,
        *,
        retryable: bool,
        status: int | None = None,
        retry_after_s: float | None = None,
    ) -> None:
        super().__init__(message)
        self.retryable = retryable
        self.status = status
        self.retry_after_s = retry_after_s


class Sink(Protocol):
    """Delivers one encoded batch within `timeout_s` seconds or raises `SendError`."""

    def send(self, body: bytes, timeout_s: float) -> None: ...

    def close(self) -> None: ...

    def describe(self) -> str: ...


class HttpSink:
    """POST `{url}/v1/reports` (the collector HTTP contract), gzip above `GZIP_MIN_BYTES`.

    One connection per batch: batches are seconds apart, and a fresh connection never inherits
    a half-dead socket from a collector restart. Proxies from the environment are not used (the
    collector is a sidecar or on the job's network). `timeout_s` is the deadline of the whole
    exchange (connect, send, response), not of each socket read: a collector that trickles its
    answer a byte at a time is cut off at the deadline like a silent one.
    """

    def __init__(self, url: str, token: str | None = None) -> None:
        parsed = urllib.parse.urlsplit(url)
        if parsed.scheme not in ("http", "https") or not parsed.hostname:
            raise ValueError(f"collector URL must be http(s)://host[:port][/path], got {url!r}")
        self._https = parsed.scheme == "https"
        self._host = parsed.hostname
        self._port = parsed.port
        base = parsed.path.rstrip("/")
        self._path = base if base.endswith(REPORTS_PATH) else base + REPORTS_PATH
        self._token = token
        self._url = url

    def describe(self) -> str:
        return f"collector {self._url}"

    def send(self, body: bytes, timeout_s: float) -> None:
        headers = {"Content-Type": "application/json"}
        if len(body) >= GZIP_MIN_BYTES:
            body = gzip.compress(body, compresslevel=5)
            headers["Content-Encoding"] = "gzip"
        if self._token:
            headers["Authorization"] = f"Bearer {self._token}"
        connection_type = http.client.HTTPSConnection if self._https else http.client.HTTPConnection
        timeout_s = max(timeout_s, 1e-3)
        connection = connection_type(self._host, self._port, timeout=timeout_s)
        deadline = time.monotonic() + timeout_s
        raw: socket.socket | None = None
        try:
            connection.connect()
            raw = connection.sock
            # The socket timeout alone bounds each read; re-armed from the time left before every
            # read and write, it bounds the whole exchange, even against a collector that trickles
            # its answer a byte at a time (without a timer thread per send).
            connection.sock = _DeadlineSocket(connection.sock, deadline)
            connection.request("POST", self._path, body=body, headers=headers)
            response = connection.getresponse()
            payload = response.read(64 * 1024)
        except (OSError, http.client.HTTPException) as exc:
            # Refused, reset, timed out (a hanging collector), or a garbled reply.
            late = " (deadline passed)" if time.monotonic() >= deadline else ""
            raise SendError(f"{type(exc).__name__}: {exc}{late}", retryable=True) from None
        finally:
            connection.close()
            if raw is not None:
                raw.close()
        if response.status == 200:
            return
        raise SendError(
            f"HTTP {response.status}: {_error_text(payload)}",
            retryable=response.status in _RETRYABLE_STATUS,
            status=response.status,
            retry_after_s=_retry_after_s(response.getheader("Retry-After")),
        )

    def close(self) -> None:
        return None


class _DeadlineSocket:
    """The parts of a connected socket that `http.client` uses, each read and write given the
    time left until `deadline` (monotonic seconds) as its timeout."""

    def __init__(self, sock: socket.socket, deadline: float) -> None:
        self._sock = sock
        self._deadline = deadline

    def _arm(self) -> None:
        left = self._deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("the send's deadline passed")
        self._sock.settimeout(left)

    def sendall(self, data: bytes) -> None:
        self._arm()
        self._sock.sendall(data)

    def makefile(self, mode: str) -> io.BufferedReader:
        return io.BufferedReader(_DeadlineReader(self))

    def recv_into(self, buffer: memoryview) -> int:
        self._arm()
        return self._sock.recv_into(buffer)

    def close(self) -> None:
        # http.client closes the connection before the response is read when the server will
        # close it (as a real socket's makefile allows); `HttpSink.send` closes the socket itself.
        return None


class _DeadlineReader(io.RawIOBase):
    def __init__(self, sock: _DeadlineSocket) -> None:
        self._sock = sock

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        return self._sock.recv_into(memoryview(buffer).cast("B"))


def _retry_after_s(value: str | None) -> float | None:
    """``Retry-After`` in seconds: delta-seconds or an HTTP date; None if absent or unreadable."""
    if not value:
        return None
    text = value.strip()
    if text.isascii() and text.isdigit():
        return float(min(int(text[:12]), 10**9))
    try:
        when = email.utils.parsedate_to_datetime(text)
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:
        return None
    return max(0.0, when.timestamp() - time.time())


def _error_text(payload: bytes) -> str:
    try:
        decoded = json.loads(payload)
    except ValueError:
        return payload[:200].decode("utf-8", "replace")
    if isinstance(decoded, dict) and "error" in decoded:
        field = decoded.get("field")
        return f"{decoded['error']}" + (f" (field {field})" if field else "")
    return str(decoded)[:200]


class JsonlSink:
    """Appends one batch per line to a file (the agent's local output).

    Each line is written with a single `write` on an `O_APPEND` descriptor, so several ranks can
    share one file on a local filesystem without interleaving lines.
    """

    def __init__(self, path: str) -> None:
        self._path = path
        self._lock = threading.Lock()
        self._fd: int | None = None

    def describe(self) -> str:
        return f"file {self._path}"

    def send(self, body: bytes, timeout_s: float) -> None:
        line = body.rstrip(b"\n") + b"\n"
        with self._lock:
            try:
                if self._fd is None:
                    directory = os.path.dirname(self._path)
                    if directory:
                        os.makedirs(directory, exist_ok=True)
                    self._fd = os.open(self._path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
                written = os.write(self._fd, line)
            except OSError as exc:
                raise SendError(f"{self._path}: {exc}", retryable=True) from None
            if written != len(line):
                raise SendError(f"{self._path}: short write", retryable=False)

    def close(self) -> None:
        with self._lock:
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None
