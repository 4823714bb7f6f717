"""Test helpers for the agent tests (std lib only): an in-process collector stub on port 0, a
wedged collector, a closed port, and `run_job` (the 2-rank gloo job of `agent_job.py`).

Imported from the agent test files as ``from tests.support import agent_helpers as helpers``.
"""

from __future__ import annotations

import gzip
import json
import socket
import subprocess
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from mfuscope.core.schema import ReportBatch, SchemaError

from tests.support import launch
from tests.support.wire import decode_value

__all__ = [
    "HangingCollector",
    "StubCollector",
    "closed_port_url",
    "job_command",
    "run_job",
    "start_job",
]

HERE = Path(__file__).resolve().parent


class StubCollector:
    """A collector stand-in speaking the `POST /v1/reports` contract on 127.0.0.1:0.

    `status` is what it answers (200 with `{"accepted": N, "duplicates": M}`, or an error
    status with a JSON error body). Every accepted body is validated with the schema parser and
    kept in `batches`; a schema failure is kept in `errors`.
    """

    def __init__(self, status: int = 200, token: str | None = None) -> None:
        self.status = status
        self.token = token
        self.batches: list[ReportBatch] = []
        self.errors: list[str] = []
        self.requests = 0
        self.gzip_bodies = 0
        self._seen: set[tuple[str, str, int, int]] = set()
        self._lock = threading.Lock()
        stub = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                stub._handle(self, body)

            def log_message(self, format: str, *args: Any) -> None:
                return None

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def _reply(self, handler: BaseHTTPRequestHandler, status: int, payload: dict[str, Any]) -> None:
        data = json.dumps(payload).encode()
        handler.send_response(status)
        handler.send_header("Content-Type", "application/json")
        handler.send_header("Content-Length", str(len(data)))
        handler.end_headers()
        handler.wfile.write(data)

    def _handle(self, handler: BaseHTTPRequestHandler, body: bytes) -> None:
        with self._lock:
            self.requests += 1
        if handler.path != "/v1/reports":
            self._reply(handler, 404, {"error": "not found", "field": "path"})
            return
        if self.token and handler.headers.get("Authorization") != f"Bearer {self.token}":
            self._reply(handler, 401, {"error": "bad token", "field": "Authorization"})
            return
        if self.status != 200:
            self._reply(handler, self.status, {"error": "injected failure", "field": ""})
            return
        if handler.headers.get("Content-Encoding") == "gzip":
            body = gzip.decompress(body)
            with self._lock:
                self.gzip_bodies += 1
        try:
            batch = decode_value(json.loads(body))
        except (SchemaError, ValueError) as exc:
            with self._lock:
                self.errors.append(str(exc))
            self._reply(handler, 400, {"error": str(exc), "field": getattr(exc, "field", "")})
            return
        with self._lock:
            self.batches.append(batch)
            keys = [(batch.job, batch.incarnation, batch.rank, r.step) for r in batch.reports]
            duplicates = sum(1 for k in keys if k in self._seen)
            self._seen.update(keys)
        self._reply(handler, 200, {"accepted": len(keys) - duplicates, "duplicates": duplicates})

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


class HangingCollector:
    """Accepts TCP connections and never answers (a wedged collector)."""

    def __init__(self) -> None:
        self._socket = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._socket.bind(("127.0.0.1", 0))
        self._socket.listen(64)
        self._accepted: list[socket.socket] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._socket.getsockname()[1]}"

    @property
    def connections(self) -> int:
        return len(self._accepted)

    def _accept(self) -> None:
        self._socket.settimeout(0.05)
        while not self._stop.is_set():
            try:
                connection, _ = self._socket.accept()
            except (TimeoutError, OSError):
                continue
            self._accepted.append(connection)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(1.0)
        for connection in self._accepted:
            connection.close()
        self._socket.close()


def closed_port_url() -> str:
    """A URL on which nothing listens (connection refused): bind port 0, then close it."""
    probe = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    probe.bind(("127.0.0.1", 0))
    port = probe.getsockname()[1]
    probe.close()
    return f"http://127.0.0.1:{port}"


def run_job(
    tmp_path: Path, *args: str, timeout_s: float = 240.0, torchrun: bool = False
) -> subprocess.CompletedProcess[str]:
    """Run `agent_job.py` on 2 gloo ranks with `args` (see `job_command`)."""
    command, env = job_command(tmp_path, *args, torchrun=torchrun)
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=timeout_s)


def job_command(
    tmp_path: Path, *args: str, torchrun: bool = False
) -> tuple[list[str], dict[str, str]]:
    """The command line of `run_job` and its environment, for tests that must start the job
    themselves (to kill it mid-run): `tests/support/launch.py`, or real torchrun where the test
    is about the user's launch path (`torchrun`). Its TMPDIR (profiler traces) is
    `tmp_path/tmp`, and no MFUSCOPE_* variable of ours leaks into it."""
    return launch.job_command(
        HERE / "agent_job.py", *args, temp=tmp_path / "tmp", torchrun=torchrun
    )


def start_job(tmp_path: Path, *args: str) -> subprocess.Popen[bytes]:
    """Start `agent_job.py` on 2 gloo ranks with `args` without waiting (see `job_command`).
    Its output goes to `tmp_path/job.log` (a pipe nobody reads could fill and stall the job)."""
    command, env = job_command(tmp_path, *args)
    with (tmp_path / "job.log").open("wb") as log:
        return subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT)
