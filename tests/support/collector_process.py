"""A real `mfuscope collector` process on 127.0.0.1:0, for the tests that feed one over HTTP."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

__all__ = ["CollectorProcess"]


class CollectorProcess:
    """`mfuscope collector` in a subprocess; `url` once it has written its bound address."""

    def __init__(self, tmp_path: Path, *args: str, env: dict[str, str] | None = None) -> None:
        self.address_file = tmp_path / f"address-{time.monotonic_ns()}"
        cmd = [sys.executable, "-m", "mfuscope.cli", "collector", "--listen", "127.0.0.1:0"]
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
        self.url = "http://" + self.address_file.read_text().strip()

    def stop(self) -> tuple[int, str, str]:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        out, err = self.proc.communicate(timeout=30)
        return self.proc.returncode, out, err
