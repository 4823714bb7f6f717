"""The VictoriaMetrics fleet layout under fleet-sized load (docs/fleet.md#sizing).

One node sidecar's real `/metrics` text (a real collector fed 8 ranks' batches of a large job by
`fleet_sizing.fed_sidecar`, without per-rank labels) is served for every node of a synthetic fleet:
GPUs / 8 sidecars, jobs of 1,024 GPUs (128 nodes), each node on its own loopback address
(127.0.x.y), its counters growing at every scrape. The shipped layout runs on them: vmagent
with deploy/fleet/victoriametrics/vmagent-scrape.yml (targets replaced) and its keep-list
remote-writes to VictoriaMetrics every 15 s; vmalert evaluates the project's rules
(vmalert_rules.py) every 15 s. Each fleet size gets a fresh store; after a warm-up, measured:

- ingest: rows remote-written into VictoriaMetrics per second (vmagent's and vmalert's), and the
  active series (`vm_cache_entries{type="storage/hour_metric_ids"}`);
- CPU (cores) and resident memory (MiB, the largest seen) of victoria-metrics, vmagent, vmalert;
- vmalert: the mean seconds of one pass over each rule group (a group's rules run one
  after another, the groups side by side, every 15 s) and the passes it had to skip;
- the fleet dashboard's queries (every panel and variable, `$job` = All) on the query API: the
  median of 5 instant queries each, and of 3 range queries over the last 10 min at a 15 s step.

    .venv/bin/python benchmarks/fleet_victoriametrics.py                 # 1k, 4k, 16k GPUs, ~9 min
    .venv/bin/python benchmarks/fleet_victoriametrics.py --gpus 1024 --warmup-s 30 --measure-s 30

Needs victoria-metrics, vmagent and vmalert (Debian `victoria-metrics`) on PATH. One JSON line per
fleet size, then a Markdown table.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import yaml

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(ROOT))
from fleet_sizing import sidecar_exposition  # noqa: E402

from tests.support.processes import free_port, stop  # noqa: E402
from tests.support.victoriametrics import (  # noqa: E402
    VM_BINARIES,
    Server,
    missing_binaries,
    start_server,
)

VM_DIR = ROOT / "deploy" / "fleet" / "victoriametrics"
GPUS_PER_NODE = 8
NODES_PER_JOB = 128  # jobs of 1,024 GPUs
INTERVAL = "15s"


def parse_seconds(duration: str) -> float:
    """`15s` -> 15.0 (the few durations used here)."""
    return float(duration.removesuffix("s"))


_SAMPLE = re.compile(rb"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})? (\S+)$")
_COUNTER = re.compile(rb"(_total|_bucket|_count|_sum)$")


class Sidecars:
    """Synthetic node sidecars: the same exposition for every node, under its job's name, the
    counters grown by 1 % of their value every interval (gauges as they are). The node is the
    loopback address a scrape connects to. One asyncio thread serves every scrape from bodies
    rendered once per interval and job, so that the simulator stays light beside the store."""

    def __init__(self, text: bytes, nodes: int, interval_s: float) -> None:
        self.nodes = nodes
        self.lines: list[tuple[bytes, float, bool]] = []  # (text before the value, value, counter)
        for line in text.splitlines():
            match = _SAMPLE.match(line)
            if match is None:
                self.lines.append((line + b"\n", 0.0, False))  # # HELP, # TYPE
                continue
            name, labels, value = match.groups()
            prefix = name + (labels or b"") + b" "
            self.lines.append((prefix, float(value), bool(_COUNTER.search(name))))
        self.jobs = (nodes + NODES_PER_JOB - 1) // NODES_PER_JOB
        self.bodies = self._render(0)
        self.scrapes = 0
        self.port = free_port()
        self.loop = asyncio.new_event_loop()
        self.done = asyncio.Event()
        started = threading.Event()
        self.thread = threading.Thread(target=self._run, args=(interval_s, started), daemon=True)
        self.thread.start()
        started.wait(10)

    @staticmethod
    def address(node: int) -> str:
        return f"127.0.{node // 250 + 1}.{node % 250 + 1}"

    def _render(self, tick: int) -> list[bytes]:
        """Every job's body at `tick` intervals after the start."""
        growth = 1.0 + 0.01 * tick
        bodies = []
        for job in range(self.jobs):
            label = f'job="train-{job:03d}"'.encode()
            bodies.append(
                b"".join(
                    prefix
                    if prefix.startswith(b"#")
                    else re.sub(rb'job="[^"]*"', label, prefix)
                    + repr(value * growth if counter else value).encode()
                    + b"\n"
                    for prefix, value, counter in self.lines
                )
            )
        return bodies

    def _run(self, interval_s: float, started: threading.Event) -> None:
        async def main() -> None:
            # Bound to every address (the nodes are 127.0.x.y); other peers are refused.
            server = await asyncio.start_server(self._serve, "0.0.0.0", self.port)
            started.set()
            async with server:
                tick = 0
                while True:
                    try:
                        await asyncio.wait_for(self.done.wait(), interval_s)
                        return
                    except asyncio.TimeoutError:
                        tick += 1
                        self.bodies = self._render(tick)

        self.loop.run_until_complete(main())

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peer, local = writer.get_extra_info("peername")[0], writer.get_extra_info("sockname")[0]
        _, _, third, fourth = local.split(".")
        node = (int(third) - 1) * 250 + int(fourth) - 1
        try:
            if not peer.startswith("127.") or not 0 <= node < self.nodes:
                return
            while True:  # keep-alive: one request after the other
                await reader.readuntil(b"\r\n\r\n")
                body = self.bodies[node // NODES_PER_JOB]
                self.scrapes += 1
                head = b"HTTP/1.1 200 OK\r\nContent-Type: text/plain; version=0.0.4\r\n"
                writer.write(head + b"Content-Length: %d\r\n\r\n" % len(body) + body)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass  # the scraper closed the connection
        finally:
            writer.close()

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.done.set)
        self.thread.join(timeout=30)


def _metrics(url: str) -> dict[str, float]:
    """A server's own /metrics: `name{labels}` -> value."""
    with urllib.request.urlopen(f"{url}/metrics", timeout=30) as response:
        text = response.read()
    out = {}
    for line in text.splitlines():
        match = _SAMPLE.match(line)
        if match:
            name, labels, value = match.groups()
            out[(name + (labels or b"")).decode()] = float(value)
    return out


def _group_passes(vmalert_url: str) -> dict[str, tuple[float, float, float]]:
    """vmalert's rule groups: (seconds spent in passes, passes, passes missed) so far."""
    metrics = _metrics(vmalert_url)
    out: dict[str, tuple[float, float, float]] = {}
    for key, value in metrics.items():
        match = re.match(r'vmalert_iteration_duration_seconds_sum\{group="([^"]+)"', key)
        if match:
            group = match.group(1)
            count = next(
                v
                for k, v in metrics.items()
                if k.startswith(f'vmalert_iteration_duration_seconds_count{{group="{group}"')
            )
            missed = next(
                v
                for k, v in metrics.items()
                if k.startswith(f'vmalert_iteration_missed_total{{group="{group}"')
            )
            out[group] = (value, count, missed)
    return out


def _usage(pid: int) -> tuple[float, float]:
    """(CPU seconds so far, resident MiB) of a process, from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    cpu_s = (int(fields[11]) + int(fields[12])) / 100  # utime + stime, in clock ticks of 1/100 s
    status = Path(f"/proc/{pid}/status").read_text()
    rss_kib = int(re.search(r"VmRSS:\s+(\d+)", status).group(1))  # type: ignore[union-attr]
    return cpu_s, rss_kib / 1024


def fleet_queries() -> list[tuple[str, str]]:
    """(panel / refId or $variable, query) of the fleet dashboard, `$job` and the other pickers
    as Grafana's All (`.*`), `$__rate_interval` as 1m (four 15 s scrapes)."""
    dashboard = json.loads((ROOT / "dashboards" / "mfuscope-fleet.json").read_text())
    values = {"__rate_interval": "1m", "job": ".*", "axis": ".*", "tier": ".*"}

    def substitute(expr: str) -> str:
        for name, value in values.items():
            expr = expr.replace("${" + name + "}", value).replace("$" + name, value)
        return expr

    queries = []
    for variable in dashboard["templating"]["list"]:
        if variable["type"] == "query":
            match = re.fullmatch(r"label_values\((.+),\s*(\w+)\)", variable["query"].strip())
            assert match, variable["query"]
            queries.append((f"${variable['name']}", substitute(match.group(1))))
    for panel in dashboard["panels"]:
        for target in panel.get("targets", []):
            queries.append((f"{panel['title']} / {target['refId']}", substitute(target["expr"])))
    return queries


def _timed(url: str, path: str, params: dict[str, str], repeats: int) -> tuple[float, int]:
    """(median seconds, series returned) of `repeats` GETs of a query."""
    seconds, series = [], 0
    for _ in range(repeats):
        started = time.perf_counter()
        with urllib.request.urlopen(
            f"{url}{path}?{urllib.parse.urlencode(params)}", timeout=120
        ) as response:
            body = json.load(response)
        seconds.append(time.perf_counter() - started)
        assert body["status"] == "success", body
        series = len(body["data"]["result"])
    return statistics.median(seconds), series


def _query_latency(url: str) -> dict[str, Any]:
    now = time.time()
    instant, ranged, answered = {}, {}, 0
    for name, expr in fleet_queries():
        instant[name], series = _timed(url, "/api/v1/query", {"query": expr}, 5)
        answered += series > 0
        params = {"query": expr, "start": f"{now - 600:.0f}", "end": f"{now:.0f}", "step": "15"}
        ranged[name], _ = _timed(url, "/api/v1/query_range", params, 3)
    return {
        "queries": len(instant),
        "answered": answered,
        "instant_total_s": sum(instant.values()),
        "instant_slowest": max(instant.items(), key=lambda item: item[1]),
        "range_total_s": sum(ranged.values()),
        "range_slowest": max(ranged.items(), key=lambda item: item[1]),
    }


def _start_layout(home: Path, sidecars: Sidecars, nodes: int) -> dict[str, Server]:
    rules = home / "rules"
    sources = sorted((ROOT / "deploy" / "prometheus" / "rules").glob("*.yml"))
    command = [sys.executable, str(VM_DIR / "vmalert_rules.py"), "--out", str(rules)]
    subprocess.run([*command, "--interval", INTERVAL, *map(str, sources)], check=True)
    vm = start_server(
        "victoria-metrics",
        lambda a: [
            "victoria-metrics",
            f"-storageDataPath={home / 'data'}",
            f"-httpListenAddr={a}",
            "-loggerLevel=WARN",
        ],
        home,
    )
    vmalert = start_server(
        "vmalert",
        lambda a: [
            "vmalert",
            f"-rule={rules}/*.yml",
            f"-evaluationInterval={INTERVAL}",
            f"-datasource.url={vm.url}",
            f"-remoteWrite.url={vm.url}",
            f"-remoteRead.url={vm.url}",
            "-notifier.url=http://127.0.0.1:9",  # nothing listens: alerts are not measured here
            f"-httpListenAddr={a}",
            "-loggerLevel=ERROR",
        ],
        home,
    )
    config: dict[str, Any] = yaml.safe_load((VM_DIR / "vmagent-scrape.yml").read_text())
    targets = [f"{Sidecars.address(n)}:{sidecars.port}" for n in range(nodes)]
    config["scrape_configs"][0]["static_configs"] = [{"targets": targets}]
    (home / "scrape.yml").write_text(yaml.safe_dump(config), encoding="utf-8")
    vmagent = start_server(
        "vmagent",
        lambda a: [
            "vmagent",
            f"-promscrape.config={home / 'scrape.yml'}",
            f"-remoteWrite.url={vm.url}/api/v1/write",
            f"-remoteWrite.urlRelabelConfig={VM_DIR / 'vmagent-remote-write.yml'}",
            "-remoteWrite.label=cluster=cluster-a",
            f"-remoteWrite.tmpDataPath={home / 'vmagent'}",
            f"-httpListenAddr={a}",
            "-loggerLevel=ERROR",
        ],
        home,
    )
    return {"victoria-metrics": vm, "vmalert": vmalert, "vmagent": vmagent}


def measure(text: bytes, gpus: int, warmup_s: float, measure_s: float, tmp: Path) -> dict[str, Any]:
    nodes = gpus // GPUS_PER_NODE
    sidecars = Sidecars(text, nodes, parse_seconds(INTERVAL))
    home = tmp / f"gpus-{gpus}"
    servers: dict[str, Server] = {}
    try:
        servers = _start_layout(home, sidecars, nodes)
        vm = servers["victoria-metrics"]
        time.sleep(warmup_s)
        rows = 'vm_rows_inserted_total{type="promremotewrite"}'
        before, started = _metrics(vm.url)[rows], time.monotonic()
        passes_before = _group_passes(servers["vmalert"].url)
        cpu_before = {name: _usage(s.process.pid)[0] for name, s in servers.items()}
        rss = dict.fromkeys(servers, 0.0)
        while time.monotonic() - started < measure_s:
            for name, server in servers.items():
                rss[name] = max(rss[name], _usage(server.process.pid)[1])
            time.sleep(2)
        elapsed = time.monotonic() - started
        own = _metrics(vm.url)
        cpu = {
            name: (_usage(s.process.pid)[0] - cpu_before[name]) / elapsed
            for name, s in servers.items()
        }
        passes = _group_passes(servers["vmalert"].url)
        group_s = {  # mean seconds of one pass over a group's rules, while measuring
            group: (passes[group][0] - passes_before[group][0])
            / max(1.0, passes[group][1] - passes_before[group][1])
            for group in passes
        }
        missed = sum(passes[g][2] - passes_before[g][2] for g in passes)
        return {
            "gpus": gpus,
            "nodes": nodes,
            "sidecar_scrapes": sidecars.scrapes,
            "ingest_rows_per_s": (own[rows] - before) / elapsed,
            "active_series": own['vm_cache_entries{type="storage/hour_metric_ids"}'],
            "cpu_cores": cpu,
            "rss_mib": rss,
            "vmalert_group_pass_s": group_s,
            "vmalert_passes_missed": missed,
            **_query_latency(vm.url),
        }
    finally:
        for server in reversed(list(servers.values())):
            stop(server.process)
        sidecars.close()


def _table(results: list[dict[str, Any]]) -> str:
    rows = [
        "| GPUs | sidecars | active series | ingest samples/s | VictoriaMetrics RSS MiB "
        "| CPU cores (VM / vmagent / vmalert) | slowest rule group, one pass s (passes missed) "
        "| fleet dashboard, instant (sum / slowest) s "
        "| fleet dashboard, 10 min range (sum / slowest) s |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        cpu = r["cpu_cores"]
        rows.append(
            f"| {r['gpus']:,} | {r['nodes']:,} | {r['active_series']:,.0f} | "
            f"{r['ingest_rows_per_s']:,.0f} | {r['rss_mib']['victoria-metrics']:,.0f} | "
            f"{cpu['victoria-metrics']:.2f} / {cpu['vmagent']:.2f} / {cpu['vmalert']:.2f} | "
            f"{max(r['vmalert_group_pass_s'].values()):.2f} ({r['vmalert_passes_missed']:.0f}) | "
            f"{r['instant_total_s']:.2f} / "
            f"{r['instant_slowest'][1]:.3f} | {r['range_total_s']:.2f} / "
            f"{r['range_slowest'][1]:.3f} |"
        )
    return "\n".join(rows)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpus", type=int, nargs="+", default=[1024, 4096, 16384])
    parser.add_argument("--warmup-s", type=float, default=60.0, help="before measuring")
    parser.add_argument("--measure-s", type=float, default=90.0, help="measuring time")
    args = parser.parse_args()
    reason = missing_binaries(VM_BINARIES)
    if reason:
        print(f"error: {reason}", file=sys.stderr)
        return 2
    if max(args.gpus) // GPUS_PER_NODE > 250 * 254:
        print("error: at most 63,500 sidecars (loopback addresses)", file=sys.stderr)
        return 2
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        text = sidecar_exposition(False, 12.0, Path(tmp))
        for gpus in args.gpus:
            results.append(measure(text, gpus, args.warmup_s, args.measure_s, Path(tmp)))
            print(json.dumps(results[-1]), flush=True)
    print(_table(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
