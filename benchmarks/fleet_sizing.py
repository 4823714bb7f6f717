"""Fleet sizing: what one node sidecar costs its edge Prometheus, and what the edge sends on.

One real collector (the node sidecar) receives the load generator's batches
(`_collector_loadgen.py`: the agent's payloads, every 10th step profiled with collectives) from the
8 ranks of one node of a large job, one step per second; a real Prometheus with the shipped edge
configuration (deploy/fleet/edge-prometheus.yml: the project's rules, its remote-write keep-list)
scrapes it every second. Measured, with and without per-rank labels:

- series and bytes of one ``/metrics`` scrape of the sidecar (what the edge ingests per node);
- the series that pass the edge's keep-list, split into job-level (recorded ``job...:``, one set
  per job whatever its size) and per-node ones (``instance:`` straggler series and the raw
  families the fleet dashboard lists), counted on the edge Prometheus.

docs/fleet.md#sizing lists these per node; `fleet_victoriametrics.py` serves this sidecar text
(`sidecar_exposition`) for every node of a synthetic fleet and measures the central store.

    .venv/bin/python benchmarks/fleet_sizing.py            # ~40 s; needs prometheus on PATH
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import yaml

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
from _collector_loadgen import batch_body  # noqa: E402

RANKS_PER_NODE = 8
WORLD = 4096
STEPS_PER_BATCH = 5


def _start(cmd: list[str], ready: Path) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 30
    while not ready.exists():
        if proc.poll() is not None or time.time() > deadline:
            raise RuntimeError(f"{cmd[0]} did not start")
        time.sleep(0.05)
    return proc


def _feed(addr: str, stop: threading.Event) -> None:
    step = 1
    while not stop.is_set():
        for rank in range(RANKS_PER_NODE):
            body, gz = batch_body(WORLD, rank, step, STEPS_PER_BATCH)
            headers = {"Content-Type": "application/json"}
            headers |= {"Content-Encoding": "gzip"} if gz else {}
            request = urllib.request.Request(f"http://{addr}/v1/reports", body, headers)
            with urllib.request.urlopen(request, timeout=10):
                pass
        step += STEPS_PER_BATCH
        stop.wait(1.0)


def _query(url: str, expr: str) -> float:
    query = urllib.parse.urlencode({"query": expr})
    with urllib.request.urlopen(f"{url}/api/v1/query?{query}", timeout=10) as response:
        result = json.load(response)["data"]["result"]
    return float(result[0]["value"][1]) if result else 0.0


@contextmanager
def fed_sidecar(per_rank: bool, tmp: Path) -> Iterator[str]:
    """A real collector (HOST:PORT) fed the 8 ranks' batches, one step per second, while inside."""
    addr_file = tmp / f"collector-{per_rank}"
    cmd = [sys.executable, "-m", "mfuscope.cli", "collector", "--listen", "127.0.0.1:0"]
    cmd += ["--address-file", str(addr_file), "--rate-limit", "0"]
    cmd += ["--per-rank-labels"] if per_rank else []
    collector = _start(cmd, addr_file)
    addr = addr_file.read_text().strip()
    stop = threading.Event()
    feeder = threading.Thread(target=_feed, args=(addr, stop), daemon=True)
    feeder.start()
    try:
        yield addr
    finally:
        stop.set()
        feeder.join(timeout=10)
        collector.terminate()
        collector.wait(timeout=30)


def sidecar_exposition(per_rank: bool, seconds: float, tmp: Path) -> bytes:
    """One node sidecar's `/metrics` text after `seconds` of feeding."""
    with fed_sidecar(per_rank, tmp) as addr:
        time.sleep(seconds)
        with urllib.request.urlopen(f"http://{addr}/metrics", timeout=10) as response:
            text: bytes = response.read()
    return text


def measure(per_rank: bool, seconds: float, tmp: Path) -> dict[str, Any]:
    with fed_sidecar(per_rank, tmp) as addr:
        return _measure_edge(addr, per_rank, seconds, tmp)


def _measure_edge(addr: str, per_rank: bool, seconds: float, tmp: Path) -> dict[str, Any]:
    edge: dict[str, Any] = yaml.safe_load((ROOT / "deploy/fleet/edge-prometheus.yml").read_text())
    (remote,) = edge.pop("remote_write")
    (keep,) = [r for r in remote["write_relabel_configs"] if r["action"] == "keep"]
    edge["global"] |= {"scrape_interval": "1s", "evaluation_interval": "1s"}
    edge["rule_files"] = [str((ROOT / "deploy/fleet" / f).resolve()) for f in edge["rule_files"]]
    edge["scrape_configs"][0]["static_configs"] = [{"targets": [addr]}]
    home = tmp / f"prometheus-{per_rank}"
    home.mkdir()
    (home / "prometheus.yml").write_text(yaml.safe_dump(edge))
    port = 19090 + per_rank
    prometheus = subprocess.Popen(
        [
            shutil.which("prometheus") or "prometheus",
            f"--config.file={home / 'prometheus.yml'}",
            f"--storage.tsdb.path={home / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--log.level=error",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        time.sleep(seconds)
        with urllib.request.urlopen(f"http://{addr}/metrics", timeout=10) as response:
            text = response.read()
        lines = [ln for ln in text.decode().splitlines() if ln and not ln.startswith("#")]
        url = f"http://127.0.0.1:{port}"
        job_level = _query(url, 'count({__name__=~"job(_[a-z]+)*:mfuscope_.*"})')
        return {
            "per_rank_labels": per_rank,
            "sidecar_series": len(lines),
            "sidecar_scrape_bytes": len(text),
            "kept_job_level": job_level,
            "kept_per_node": _query(url, f'count({{__name__=~"{keep["regex"]}"}})') - job_level,
        }
    finally:
        prometheus.terminate()
        prometheus.wait(timeout=30)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=15.0, help="feeding time per variant")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        for per_rank in (False, True):
            print(json.dumps(measure(per_rank, args.seconds, Path(tmp))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
