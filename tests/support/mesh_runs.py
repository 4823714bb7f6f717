"""Running `tests/support/mesh_job.py` on gloo ranks, the collectors and rules that watch it, and
reading a collector's series, for the collective-records integration tests."""

from __future__ import annotations

import os
import re
import sys
import threading
import time
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from subprocess import Popen

from tests.support.launch import PRELOAD, job_command
from tests.support.processes import spawn, stop

__all__ = ["ReportTee", "hang_rule_files", "mesh_job", "scrape", "start_collectors"]

SUPPORT = Path(__file__).resolve().parent
ROOT = SUPPORT.parents[1]
RULES = ROOT / "deploy" / "prometheus" / "rules"
BIN = Path(sys.executable).parent
_SAMPLE = re.compile(r"^(\w+)\{([^}]*)\} (\S+)$")
# MFUScopeCollectiveHang's condition as shipped: ranks waited 60 s in a collective.
HANG_EXPR = "expr: max by (job) (mfuscope_collective_blocked_seconds) >= 60\n"


def mesh_job(tmp_path: Path, ranks: int, *args: str) -> tuple[list[str], dict[str, str]]:
    """The command and environment that run the job on `ranks` gloo ranks with `args`
    (`launch.job_command`, TMPDIR `tmp_path`)."""
    # `mesh_groups` ranks that never profile import neither torch._dynamo nor the profiler
    # (mesh_job.py): their launcher need not either.
    light = "mesh_groups" in args and "--no-profile" in args
    preload = ("torch", "torch.distributed") if light else PRELOAD
    return job_command(SUPPORT / "mesh_job.py", *args, temp=tmp_path, ranks=ranks, preload=preload)


def scrape(url: str, name: str) -> list[tuple[dict[str, str], float]]:
    """The samples of metric `name` on a collector's /metrics: (labels, value)."""
    with urllib.request.urlopen(url + "/metrics", timeout=30) as response:
        lines = response.read().decode().splitlines()
    found = []
    for line in lines:
        match = _SAMPLE.match(line)
        if match and match.group(1) == name:
            labels = dict(re.findall(r'(\w+)="([^"]*)"', match.group(2)))
            found.append((labels, float(match.group(3))))
    return found


def hang_rule_files(directory: Path, blocked_s: float) -> list[Path]:
    """The shipped rule files, written into `directory` under their own names, with
    MFUScopeCollectiveHang paging once ranks have waited `blocked_s` instead of 60 s (a test's
    minute is long; the shipped threshold is promtool's to check, deploy/prometheus/tests)."""
    directory.mkdir(parents=True, exist_ok=True)
    paths = []
    for source in sorted(RULES.glob("*.yml")):
        text = source.read_text(encoding="utf-8")
        if "alert: MFUScopeCollectiveHang\n" in text:
            assert text.count(HANG_EXPR) == 1, f"{source}: the hang alert's condition changed"
            text = text.replace(HANG_EXPR, HANG_EXPR.replace(">= 60", f">= {blocked_s:g}"))
        path = directory / source.name
        path.write_text(text, encoding="utf-8")
        paths.append(path)
    return paths


def start_collectors(home: Path, count: int, *args: str) -> tuple[list[Popen[bytes]], list[str]]:
    """`count` `mfuscope collector` processes on free loopback ports, each with `args`, started
    at once; returned (processes, HOST:PORT each) once every one has written its address. Logs
    in ``home/collector{i}.log``; the caller stops them (`processes.stop`), also when this
    raises."""
    files = [home / f"collector{i}.address" for i in range(count)]
    processes = []
    for i, address_file in enumerate(files):
        command = [str(BIN / "mfuscope"), "collector", "--listen", "127.0.0.1:0"]
        command += ["--address-file", str(address_file), *args]
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        processes.append(spawn(command, home / f"collector{i}.log", env=env))
    deadline = time.monotonic() + 30
    try:
        for i, (process, address_file) in enumerate(zip(processes, files, strict=True)):
            while process.poll() is None and time.monotonic() < deadline:
                if address_file.is_file() and address_file.read_text().endswith("\n"):
                    break
                time.sleep(0.05)
            log = (home / f"collector{i}.log").read_text(errors="replace")
            assert process.poll() is None and address_file.is_file(), log
    except BaseException:
        for process in processes:
            stop(process)
        raise
    return processes, [f.read_text().strip() for f in files]


class ReportTee:
    """One loopback HTTP server that hands every agent batch to several collectors, so that one
    job is watched in two layouts from the same batches: an agent reporting to ``urls[i]`` has
    each of its batches POSTed, unchanged, to every collector URL of ``routes[i]``. The agent gets
    the first answer that is not 200 (it then sends the batch again; the collectors drop the
    steps they already have), else 200. `close` stops it."""

    _HEADERS = ("Content-Type", "Content-Encoding", "Authorization")

    def __init__(self, routes: list[list[str]]) -> None:
        tee = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                route = self.path.split("/")[1]
                body = self.rfile.read(int(self.headers["Content-Length"]))
                headers = {k: v for k in tee._HEADERS if (v := self.headers.get(k)) is not None}
                status, answer = 404, b""
                if route.isdigit() and int(route) < len(routes):
                    status, answer = tee._forward(routes[int(route)], body, headers)
                self.send_response(status)
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, format: str, *args: object) -> None:
                return None

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        port = self._server.server_address[1]
        self.urls = [f"http://127.0.0.1:{port}/{i}" for i in range(len(routes))]
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    @staticmethod
    def _forward(urls: list[str], body: bytes, headers: dict[str, str]) -> tuple[int, bytes]:
        answers = []
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # as the agent
        for url in urls:
            request = urllib.request.Request(url + "/v1/reports", data=body, headers=headers)
            try:
                with opener.open(request, timeout=10) as response:
                    answers.append((response.status, response.read()))
            except urllib.error.HTTPError as error:
                with error:
                    answers.append((error.code, error.read()))
            except OSError as error:
                answers.append((502, str(error).encode()))
        return next((a for a in answers if a[0] != 200), answers[-1])

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=10)
