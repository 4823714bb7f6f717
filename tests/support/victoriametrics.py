"""VictoriaMetrics, vmagent and vmalert from their binaries (Debian's `victoria-metrics`, which
`./dev` installs), for the integration tests and the fleet benchmark. Std lib only.

Each server gets a free loopback port (tried again if another process takes it first) and its
output in a log file; `stop` from `processes` ends it.
"""

from __future__ import annotations

import shutil
import subprocess
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path

from tests.support.processes import free_port, http_ready, spawn, stop

__all__ = [
    "VM_BINARIES",
    "Server",
    "flushing",
    "force_flush",
    "missing_binaries",
    "start_server",
    "start_victoria_metrics",
]

# The binaries the fleet layout runs, and the Debian package that has each.
VM_BINARIES = {
    "victoria-metrics": "victoria-metrics",
    "vmagent": "victoria-metrics",
    "vmalert": "victoria-metrics",
}


def missing_binaries(binaries: dict[str, str]) -> str | None:
    """None when every binary is on PATH, else one line naming the missing ones and their
    packages."""
    missing = sorted(name for name in binaries if shutil.which(name) is None)
    if not missing:
        return None
    packages = sorted({binaries[name] for name in missing})
    return (
        f"{', '.join(missing)} not installed: `./dev setup` installs them "
        f"(Debian package {', '.join(packages)})"
    )


@dataclass
class Server:
    """A server process listening on `url`, its log in `log`."""

    url: str
    process: subprocess.Popen[bytes]
    log: Path

    def log_tail(self, chars: int = 3000) -> str:
        return self.log.read_text(errors="replace")[-chars:]


def start_server(
    name: str,
    command: Callable[[str], Sequence[str]],
    home: Path,
    health_path: str = "/health",
    timeout_s: float = 30.0,
) -> Server:
    """Start `command(HOST:PORT)` on a free loopback port, its log in `home/NAME.log`; return it
    once GET `health_path` answers 200. Raises RuntimeError with the log's end if it never does."""
    home.mkdir(parents=True, exist_ok=True)
    log = home / f"{name}.log"
    for _attempt in range(5):  # the probed free port can be taken before the server binds it
        address = f"127.0.0.1:{free_port()}"
        process = spawn([*command(address)], log)
        server = Server(f"http://{address}", process, log)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and process.poll() is None:
            if http_ready(server.url + health_path):
                return server
            time.sleep(0.1)
        stop(process)
    raise RuntimeError(f"{name} did not start: {log.read_text(errors='replace')[-2000:]}")


def start_victoria_metrics(home: Path) -> Server:
    """A single-node VictoriaMetrics storing under `home/data` that shows the newest samples at
    once (by default queries hide the last 30 s)."""
    return start_server(
        "victoria-metrics",
        lambda address: [
            "victoria-metrics",
            f"-storageDataPath={home / 'data'}",
            f"-httpListenAddr={address}",
            "-search.latencyOffset=0",
            "-loggerLevel=WARN",
        ],
        home,
    )


def force_flush(store_url: str) -> None:
    """Make what VictoriaMetrics has ingested searchable now (`/internal/force_flush`)."""
    with urllib.request.urlopen(f"{store_url}/internal/force_flush", timeout=5):
        pass


@contextmanager
def flushing(store_url: str, every_s: float = 0.5) -> Iterator[None]:
    """While inside, make VictoriaMetrics' newest data searchable every `every_s` seconds
    (`/internal/force_flush`). VictoriaMetrics buffers what it ingests and shows a new series
    to queries only some 10 s after its first sample (measured with 1.79); a rule reading
    another rule's new series waits that long per link of the chain, which a test at a 2 s
    cadence cannot afford."""
    done = threading.Event()

    def flush() -> None:
        while not done.wait(every_s):
            with suppress(OSError):  # the store is stopping or busy: the next round tries again
                force_flush(store_url)

    thread = threading.Thread(target=flush, daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join(timeout=10)
