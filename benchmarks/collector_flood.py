"""Job-name flood: one client posts 10,000 batches, each under a new job name, to a real collector.

Measured at the default cardinality limits (`--max-jobs` 256) against a baseline measured in the
same run: the same flood against a collector whose job limit is raised above the flood
(`--max-jobs 20000`, what the collector did before it had limits). Both run with `--rate-limit 0`,
so the cardinality limit is what is measured (the default per-address rate limit would only slow
the flood down; rotating source addresses gets around it). Each batch is one profiled step with
collectives on two axes and a topology, like a real rank's. Printed per configuration: the
batches accepted and refused (by status), ``/metrics`` size and scrape time (median of 5,
client-side), ``/v1/summary`` time, and the collector's RSS after the flood; then the ratios.

Target: at the defaults, ``/metrics`` and RSS stay bounded whatever the flood (size and scrape
time a small fraction of the baseline's).

    .venv/bin/python benchmarks/collector_flood.py [--jobs 10000]
"""

from __future__ import annotations

import argparse
import http.client
import json
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

from collector_load import _rss_mb

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the batch builder lives in tests/support
from tests.support.collector_fakes import batch_dict, report_dict  # noqa: E402

COLLECTIVES = [
    {
        "op": op,
        "axis": axis,
        "tier": tier,
        "group_size": 8,
        "bytes": 1 << 26,
        "count": 4,
        "seconds": 0.02,
        "overlapped_s": 0.01,
    }
    for op, axis, tier in (
        ("all_reduce", "dp", "inter_node"),
        ("all_gather", "tp", "intra_node"),
        ("reduce_scatter", "tp", "intra_node"),
    )
]
TOPOLOGY = {
    "groups": [
        {"axis": "tp", "tier": "intra_node", "size": 8, "spans_hosts": False},
        {"axis": "dp", "tier": "inter_node", "size": 2, "spans_hosts": True},
    ]
}


def _start(tmp: Path, *args: str) -> tuple[subprocess.Popen[bytes], str]:
    addr_file = tmp / f"addr-{time.monotonic_ns()}"
    cmd = [sys.executable, "-m", "mfuscope.cli", "collector", "--listen", "127.0.0.1:0"]
    cmd += ["--address-file", str(addr_file), "--rate-limit", "0", *args]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL)
    deadline = time.time() + 30
    while not addr_file.exists():
        if proc.poll() is not None or time.time() > deadline:
            raise RuntimeError("collector did not start")
        time.sleep(0.05)
    return proc, addr_file.read_text().strip()


def _flood(addr: str, jobs: int) -> Counter[int]:
    host, port = addr.rsplit(":", 1)
    statuses: Counter[int] = Counter()
    connection = http.client.HTTPConnection(host, int(port), timeout=30)
    headers = {"Content-Type": "application/json"}
    for i in range(jobs):
        report = report_dict(1, collectives=COLLECTIVES, exposed=("dp", "inter_node"))
        body = json.dumps(batch_dict(job=f"flood-{i}", reports=[report], topology=TOPOLOGY))
        connection.request("POST", "/v1/reports", body=body, headers=headers)
        response = connection.getresponse()
        response.read()
        statuses[response.status] += 1
    connection.close()
    return statuses


def _timed_get(addr: str, path: str) -> tuple[float, int]:
    """(seconds, bytes) of one GET, client-side; generous timeout, the baseline is slow."""
    host, port = addr.rsplit(":", 1)
    connection = http.client.HTTPConnection(host, int(port), timeout=120)
    started = time.perf_counter()
    connection.request("GET", path)
    response = connection.getresponse()
    size = len(response.read())
    connection.close()
    assert response.status == 200, response.status
    return time.perf_counter() - started, size


def run(label: str, jobs: int, tmp: Path, *args: str) -> dict[str, Any]:
    proc, addr = _start(tmp, *args)
    try:
        started = time.perf_counter()
        statuses = _flood(addr, jobs)
        flood_s = time.perf_counter() - started
        scrapes = [_timed_get(addr, "/metrics") for _ in range(5)]
        return {
            "config": label,
            "statuses": dict(sorted(statuses.items())),
            "flood_s": flood_s,
            "metrics_bytes": scrapes[-1][1],
            "scrape_s": statistics.median(s for s, _ in scrapes),
            "summary_s": statistics.median(_timed_get(addr, "/v1/summary")[0] for _ in range(3)),
            "rss_mb": _rss_mb(proc.pid),
        }
    finally:
        proc.terminate()
        proc.wait(30)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=10_000, help="distinct job names posted")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        limited = run("defaults (--max-jobs 256)", args.jobs, Path(tmp))
        baseline = run("baseline (--max-jobs 20000)", args.jobs, Path(tmp), "--max-jobs", "20000")
    for r in (limited, baseline):
        print(
            f"{r['config']:<28} statuses {r['statuses']}  flood {r['flood_s']:.1f} s  "
            f"/metrics {r['metrics_bytes'] / 1e6:.2f} MB in {r['scrape_s'] * 1e3:.0f} ms  "
            f"/v1/summary {r['summary_s'] * 1e3:.0f} ms  RSS {r['rss_mb']:.0f} MB"
        )
    size_ratio = limited["metrics_bytes"] / baseline["metrics_bytes"]
    print(
        f"defaults / baseline: /metrics size {size_ratio:.3f}"
        f", scrape time {limited['scrape_s'] / baseline['scrape_s']:.3f}"
        f", RSS {limited['rss_mb'] / baseline['rss_mb']:.2f}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
