"""Child processes of the integration tests (servers started from their binaries): start one with
its output in a log file, stop it for sure, and poll its readiness endpoint. Std lib only."""

from __future__ import annotations

import subprocess
import urllib.request
from pathlib import Path

__all__ = ["http_ready", "spawn", "stop"]


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


def http_ready(url: str) -> bool:
    """True when GET `url` answers 200 (a server's readiness endpoint)."""
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return bool(response.status == 200)
    except OSError:
        return False
