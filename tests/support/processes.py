"""Child processes of the integration tests (servers started from their binaries): start one with
its output in a log file, stop it for sure, and poll its readiness endpoint. Std lib only."""

from __future__ import annotations

import socket
import subprocess
import urllib.request
from pathlib import Path

__all__ = ["free_port", "http_ready", "spawn", "stop"]


def spawn(
    command: list[str], log: Path, env: dict[str, str] | None = None
) -> subprocess.Popen[bytes]:
    """Start `command` with its output going to `log`; returns its `subprocess.Popen`."""
    with log.open("wb") as log_file:
        return subprocess.Popen(command, stdout=log_file, stderr=subprocess.STDOUT, env=env)


def stop(process: subprocess.Popen[bytes]) -> None:
    """Terminate `process` (kill it after 10 s) and reap it."""
    if process.poll() is not None:
        return
    process.terminate()
    try:
        process.wait(timeout=10)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now (another process can take it before it is bound)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def http_ready(url: str) -> bool:
    """True when GET `url` answers 200 (a server's readiness endpoint)."""
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return bool(response.status == 200)
    except OSError:
        return False
