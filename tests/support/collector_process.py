"""`mfuscope collector` in a subprocess for the integration tests, plus small HTTP helpers."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

__all__ = ["CollectorProcess", "post", "request"]


class CollectorProcess:
    """`mfuscope collector` in a subprocess; `url` once it has written its bound address.
    `listen` defaults to a free loopback port."""

    def __init__(
        self,
        tmp_path: Path,
        *args: str,
        env: dict[str, str] | None = None,
        listen: str = "127.0.0.1:0",
    ) -> None:
        self.address_file = tmp_path / f"address-{time.monotonic_ns()}"
        cmd = [sys.executable, "-m", "mfuscope.cli", "collector", "--listen", listen]
        cmd += ["--address-file", str(self.address_file), *args]
        self.proc = subprocess.Popen(
            cmd,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, **(env or {})},
        )
        deadline = time.monotonic() + 30
        while not self.address_file.exists():
            if self.proc.poll() is not None:
                raise RuntimeError(f"collector exited: {self.proc.communicate()}")
            if time.monotonic() > deadline:
                raise TimeoutError("collector did not start")
            time.sleep(0.02)
        self.address = self.address_file.read_text().strip()
        self.url = "http://" + self.address

    def stop(self) -> tuple[int, str, str]:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        out, err = self.proc.communicate(timeout=30)
        return self.proc.returncode, out, err

    def kill(self) -> None:
        """SIGKILL: the collector vanishes mid-whatever, as in a node failure."""
        self.proc.kill()
        self.proc.communicate(timeout=30)


def request(
    url: str, body: bytes | None = None, headers: dict[str, str] | None = None
) -> tuple[int, dict[str, str], bytes]:
    req = urllib.request.Request(url, data=body, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status, dict(resp.headers), resp.read()
    except urllib.error.HTTPError as exc:
        with exc:
            return exc.code, dict(exc.headers), exc.read()


def post(url: str, batch: Any, **headers: str) -> tuple[int, Any]:
    """POST one batch (a JSON-ready value, or bytes as they are) to `url`/v1/reports."""
    body = batch if isinstance(batch, bytes) else json.dumps(batch).encode()
    headers = {"Content-Type": "application/json", **headers}
    status, _, payload = request(url + "/v1/reports", body, headers)
    return status, json.loads(payload)
