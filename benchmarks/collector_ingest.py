"""The collector's per-report path in one process: decode, validate and apply every batch of a
4,096-rank job (today's schema-1.2 payloads, `_collector_loadgen.py`), no HTTP.

Counted in CPU time of this process (robust to a busy shared machine, unlike wall-clock rates):
CPU per batch and per report of `Routes.handle` (gunzip, the typed decode, the schema's rules,
the aggregation state), of which the garbage collector's passes, and the longest single pass;
the CPU of one ``/metrics`` render at the end. The baseline, in the same run: a bare
``json.loads`` of the same bodies. ``--before COMMIT`` runs the same measurement with that
commit's collector (exported with ``git archive``) in a fresh process, for before/after ratios.

    .venv/bin/python benchmarks/collector_ingest.py --before main
    .venv/bin/python benchmarks/collector_ingest.py --ranks 8192 --payload 1.0
"""

from __future__ import annotations

import argparse
import gc
import gzip
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from _collector_loadgen import batch_body  # noqa: E402
from collector_load import export_tree  # noqa: E402


def measure(world: int, rounds: int, payload: str) -> dict[str, Any]:
    """Feed `rounds` batches of every rank (5 steps each) to a fresh collector's routes."""
    from mfuscope.collector import Aggregator, StateConfig
    from mfuscope.collector._routes import REPORTS_PATH, HttpRequest, Routes

    bodies = [
        batch_body(world, r, 1 + k * 5, 5, payload) for k in range(rounds) for r in range(world)
    ]
    routes = Routes(Aggregator(StateConfig(), max_body_bytes=16 << 20))
    clock = time.process_time
    passes: list[float] = []
    started = [0.0]

    def on_gc(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            started[0] = clock()
        else:
            passes.append(clock() - started[0])

    reports = 0
    gc.callbacks.append(on_gc)
    cpu0 = clock()
    for body, gz in bodies:
        request = HttpRequest(
            method="POST",
            path=REPORTS_PATH,
            client="10.0.0.1",
            authorization=None,
            content_length=len(body),
            content_encoding="gzip" if gz else "",
        )
        response = routes.before_body(request) or routes.handle(request, body)
        if response.status != 200:
            raise RuntimeError(f"refused: {response.body[:200]!r}")
        reports += json.loads(response.body)["accepted"]
    cpu = clock() - cpu0
    gc.callbacks.remove(on_gc)
    scrape = HttpRequest(
        method="GET", path="/metrics", client="x", authorization=None, content_length=0
    )
    t0 = clock()
    size = len(routes.handle(scrape, b"").body)
    render = clock() - t0

    raw = [gzip.decompress(b) if gz else b for b, gz in bodies]
    t0 = clock()
    for body in raw:
        json.loads(body)
    bare = clock() - t0
    return {
        "ranks": world,
        "payload": payload,
        "batches": len(bodies),
        "reports": reports,
        "cpu_per_batch_s": cpu / len(bodies),
        "cpu_per_report_s": cpu / reports,
        "gc_share": sum(passes) / cpu,
        "gc_longest_s": max(passes, default=0.0),
        "render_cpu_s": render,
        "metrics_bytes": size,
        "bare_per_report_s": bare / reports,
    }


def _print(label: str, r: dict[str, Any], before: dict[str, Any] | None) -> None:
    vs = ""
    if before is not None:
        vs = f" ({before['cpu_per_report_s'] / r['cpu_per_report_s']:.2f}x faster than before)"
    print(
        f"{label}: {r['ranks']} ranks, schema-{r['payload']} payloads, {r['batches']} batches: "
        f"CPU/report {r['cpu_per_report_s'] * 1e6:.1f} us{vs} = "
        f"{r['cpu_per_report_s'] / r['bare_per_report_s']:.1f}x bare json.loads "
        f"({r['bare_per_report_s'] * 1e6:.1f} us), one core: "
        f"{1 / r['cpu_per_report_s']:.0f} reports/s; GC {r['gc_share']:.0%} of it, longest "
        f"pass {r['gc_longest_s'] * 1e3:.0f} ms; /metrics render {r['render_cpu_s'] * 1e3:.0f} ms "
        f"CPU ({r['metrics_bytes']} bytes)"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=4096)
    parser.add_argument("--rounds", type=int, default=4, help="batches per rank (default 4)")
    parser.add_argument("--payload", default="1.2", choices=["1.2", "1.0"])
    parser.add_argument("--before", metavar="COMMIT", help="also measure COMMIT's collector")
    parser.add_argument("--json", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.json:  # a child run: print the result only
        print(json.dumps(measure(args.ranks, args.rounds, args.payload)))
        return 0
    before = None
    shape = ["--ranks", str(args.ranks), "--rounds", str(args.rounds), "--payload", args.payload]
    with tempfile.TemporaryDirectory() as tmp:
        if args.before:
            env = dict(os.environ, PYTHONPATH=export_tree(args.before, Path(tmp)))
            cmd = [sys.executable, __file__, *shape, "--json"]
            before = json.loads(subprocess.check_output(cmd, env=env))
            _print(f"collector {args.before}", before, None)
        now = json.loads(subprocess.check_output([sys.executable, __file__, *shape, "--json"]))
        _print("this checkout", now, before)
    return 0


if __name__ == "__main__":
    sys.exit(main())
