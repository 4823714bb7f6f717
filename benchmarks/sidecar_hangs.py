"""A hang at scale across per-node sidecars: how soon the page names the stalled rank, how many
series the hang makes, and what the rules cost Prometheus (docs/fleet.md#hangs-across-sidecars).

    python benchmarks/sidecar_hangs.py --ranks 1024 --per-sidecar 8     # 128 sidecars
    python benchmarks/sidecar_hangs.py --ranks 8192 --per-sidecar 8     # 1,024 sidecars

`--ranks / --per-sidecar` in-process sidecar collectors on the real clock take the batches their
ranks' agents would send, from the generator of `tests/support/sidecar_fleet.py` (which says the
layout: no node-mate in any group; rank 17 stalls outside any collective, its column group waits
for it, every other rank stops too). The same job runs in the suite under promtool on a fake
clock (tests/integration/prometheus/test_sidecar_scale.py).

A real Prometheus scrapes the sidecars (one HTTP endpoint serving every sidecar's series with its
own `instance` label, as `honor_labels: true` keeps it) and evaluates the shipped rules, both every
`--interval` seconds (default 15, the shipped cadence). Printed: seconds from the stall until the
rule names rank 17 and until MFUScopeCollectiveHang fires naming it alone; the hang's series
(the collectors' hang families, and the recorded suspects) and all series; each rule group's
evaluation time during the hang, as a ratio to the same group's time before it (same run, same
machine). Takes 3 to 4 minutes per run.
"""

from __future__ import annotations

import argparse
import json
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import yaml
from mfuscope.collector._clock import SystemClock
from mfuscope.exporters.prometheus import new_registry, render

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from tests.support.sidecar_fleet import STALLED, Fleet  # noqa: E402

RULES = sorted((ROOT / "deploy" / "prometheus" / "rules").glob("*.yml"))
HANG_FAMILIES = (
    "mfuscope_collective_(group_waiting_seq|group_waiting_seconds|group_entered_seq|"
    "blocked_ranks|blocked_seconds|hang_suspect_seconds|hang_suspects)"
)


def _feed(fleet: Fleet, stop: threading.Event) -> None:
    """Send the fleet's batches as they fall due, in real time."""
    while not stop.is_set():
        fleet.send_due(time.monotonic())
        stop.wait(0.05)


def _serve(fleet: Fleet) -> ThreadingHTTPServer:
    registry = new_registry(lambda: tuple(fleet.families()))

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body, content_type = render(registry)
            self.send_response(200)
            self.send_header("Content-Type", content_type)
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _get(url: str, path: str, **params: str) -> Any:
    query = f"?{urllib.parse.urlencode(params)}" if params else ""
    with urllib.request.urlopen(f"{url}{path}{query}", timeout=30) as response:
        return json.load(response)


def _value(url: str, expr: str) -> float:
    result = _get(url, "/api/v1/query", query=expr)["data"]["result"]
    return float(result[0]["value"][1]) if result else 0.0


def _head_series(url: str) -> int:
    return int(_get(url, "/api/v1/status/tsdb")["data"]["headStats"]["numSeries"])


def _group_times(url: str) -> dict[str, float]:
    groups = _get(url, "/api/v1/rules")["data"]["groups"]
    return {g["name"]: float(g["evaluationTime"]) for g in groups}


def measure(ranks: int, per_sidecar: int, interval_s: int, tmp: Path) -> dict[str, Any]:
    healthy_s = 3 * interval_s + 5
    fleet = Fleet(ranks, per_sidecar, SystemClock(), stall_at=time.monotonic() + healthy_s)
    server = _serve(fleet)  # the sidecars are thread-safe: scrapes run beside the feed
    config = {
        "global": {"scrape_interval": f"{interval_s}s", "evaluation_interval": f"{interval_s}s"},
        "rule_files": [str(p) for p in RULES],
        "scrape_configs": [
            {
                "job_name": "mfuscope-collector",
                "honor_labels": True,
                "scrape_timeout": f"{interval_s}s",
                "static_configs": [{"targets": [f"127.0.0.1:{server.server_address[1]}"]}],
            }
        ],
    }
    (tmp / "prometheus.yml").write_text(yaml.safe_dump(config))
    port = _free_port()
    prometheus = subprocess.Popen(
        [
            "prometheus",
            f"--config.file={tmp / 'prometheus.yml'}",
            f"--storage.tsdb.path={tmp / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--log.level=error",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    stop = threading.Event()
    feeder = threading.Thread(target=_feed, args=(fleet, stop), daemon=True)
    feeder.start()
    out: dict[str, Any] = {"ranks": ranks, "sidecars": len(fleet.sidecars)}
    try:
        while time.monotonic() < fleet.stall_at:
            time.sleep(0.5)
        out["healthy_series"] = _head_series(url)
        out["healthy_eval_s"] = _group_times(url)
        named_s = paged_s = None
        cause = ""
        while time.monotonic() - fleet.stall_at < 240 and paged_s is None:
            time.sleep(1.0)
            since = time.monotonic() - fleet.stall_at
            suspects = _get(
                url, "/api/v1/query", query="job_rank:mfuscope_collective_hang_suspect:seconds"
            )
            ranks_named = {r["metric"]["rank"] for r in suspects["data"]["result"]}
            if named_s is None and ranks_named:
                named_s = since
                out["named_ranks"] = sorted(ranks_named)
            alerts = _get(url, "/api/v1/alerts")["data"]["alerts"]
            for a in alerts:
                if a["labels"]["alertname"] == "MFUScopeCollectiveHang" and a["state"] == "firing":
                    cause = a["annotations"]["cause"]
                    if cause.startswith(f"rank {STALLED} "):
                        paged_s = since
        out["named_after_s"] = named_s
        out["paged_after_s"] = paged_s
        out["cause"] = cause
        time.sleep(interval_s)  # one more evaluation with every hang series present
        out["hang_series"] = _value(url, f'count({{__name__=~"{HANG_FAMILIES}"}})')
        out["suspect_series"] = _value(
            url, "count(job_rank:mfuscope_collective_hang_suspect:seconds)"
        )
        out["hang_total_series"] = _head_series(url)
        out["hang_eval_s"] = _group_times(url)
    finally:
        stop.set()
        prometheus.terminate()
        prometheus.wait(30)
        server.shutdown()
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=1024)
    parser.add_argument("--per-sidecar", type=int, default=8)
    parser.add_argument("--interval", type=int, default=15)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        r = measure(args.ranks, args.per_sidecar, args.interval, Path(tmp))
    print(
        f"{r['ranks']} ranks over {r['sidecars']} sidecars, scrape and evaluation every "
        f"{args.interval} s"
    )
    print(f"  rule names rank(s) {r.get('named_ranks')} {r['named_after_s']} s after the stall")
    print(f"  page after {r['paged_after_s']} s: {r['cause']!r}")
    print(
        f"  series: {r['hang_series']:.0f} hang series ({r['suspect_series']:.0f} recorded "
        f"suspects); all series {r['healthy_series']:.0f} before, {r['hang_total_series']:.0f} "
        "during the hang"
    )
    for group, before in sorted(r["healthy_eval_s"].items()):
        during = r["hang_eval_s"].get(group, 0.0)
        ratio = during / before if before else float("nan")
        print(
            f"  {group}: {during * 1e3:.1f} ms per evaluation during the hang ({ratio:.2f}x before)"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
