"""Collector load benchmark: simulated jobs of 64 / 1,024 / 4,096 ranks against a real collector.

Each simulated rank behaves like the agent (`agent/_sinks.py`, `agent/config.py`): one step per
second, one batch every `--batch-every` seconds (default 5, the agent's flush interval) holding the
steps since the last one, one fresh connection per batch, gzip above 4 KiB; every 10th step is a
profiled step carrying collectives, every batch the rank's collective records (schema 1.2;
`_collector_loadgen.py` builds the payloads and sends them).
Ranks are spread evenly over the batch interval.

A refused or failed send is retried as the agent does (`agent/_transport.py`: capped exponential
backoff, ``Retry-After`` honoured), so an overloaded collector shows as re-sends and batches
waiting in the ranks' buffers (an agent loses a batch only when its buffer of 10,000 reports
is full); the run stops a minute after the last batch is made, counting those still unsent.

Processes: the collector is pinned to CPU 0 (so "per core" means one core), the load generator to
CPU 1, and this script samples the collector's RSS every second and scrapes ``/metrics`` every
5 seconds. The baseline, measured in the same run on the same core with the same payloads, is a
bare ``json.loads`` of every batch in a fresh interpreter. Printed per size:

- accepted reports/s, and the collector's CPU use of its core; CPU per report vs bare decode;
- p50/p99 ingest latency (client-side: connect, send, response) vs bare decode of one batch;
- ``/metrics`` render time (client-side) and size, vs bare decode of one batch per rank;
- RSS at the end of each quarter of the run and its change over the second half (each rank's
  window of `--window-steps` = 20 steps fills during the first 20 s, so judge growth on runs of
  `--duration 120`), vs the baseline process holding one decoded batch per rank.

Targets (docs/collector.md#performance): 4,096 ranks sustained on one core, p99 ingest < 50 ms,
/metrics < 250 ms, RSS < 300 MB, no growth. The machine is shared and has 2 cores: numbers are
noisy, run twice.

    .venv/bin/python benchmarks/collector_load.py                  # 20 s per size, aiohttp
    .venv/bin/python benchmarks/collector_load.py --stacks aiohttp,stdlib --duration 60
    .venv/bin/python benchmarks/collector_load.py --ranks 4096 --payloads 1.2,1.0 --before main

Payloads are today's agent's (schema 1.2: collective records in every batch, hardware counters
every few batches; `_collector_loadgen.py`); ``--payloads 1.0`` adds a schema-1.0 agent's.
``--before COMMIT`` runs that commit's collector just before this checkout's on each size.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
LOADGEN = HERE / "_collector_loadgen.py"
QUIET_SCRAPES = 10
MAX_THREADS = 256
MAX_RSS_MB = 1024


# --- orchestration --------------------------------------------------------------------------------


def _rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def _cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _threads(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("Threads:"):
            return int(line.split()[1])
    return 0


class Collapsed(RuntimeError):
    """The collector under test stopped keeping up and grew without bound."""


def _pinned(cpu: int) -> Any:
    return lambda: os.sched_setaffinity(0, {cpu})


def _start_collector(
    stack: str, tmp: Path, per_rank: bool, tree: str | None
) -> tuple[subprocess.Popen[bytes], str]:
    addr_file = tmp / f"addr-{stack}-{time.monotonic_ns()}"  # fresh: never a stale address
    common = ["--listen", "127.0.0.1:0", "--address-file", str(addr_file), "--rate-limit", "0"]
    common += ["--per-rank-labels"] if per_rank else []
    if stack == "aiohttp":
        cmd = [sys.executable, "-m", "mfuscope.cli", "collector", *common]
    else:
        cmd = [sys.executable, str(HERE / "_stdlib_collector.py"), *common]
    env = dict(os.environ)
    if tree is not None:  # an older mfuscope, exported by `export_tree`, imported first
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [tree, env.get("PYTHONPATH")]))
    proc = subprocess.Popen(cmd, preexec_fn=_pinned(0), stdout=subprocess.DEVNULL, env=env)
    deadline = time.time() + 30
    while not addr_file.exists():
        if proc.poll() is not None or time.time() > deadline:
            raise RuntimeError(f"{stack} collector did not start")
        time.sleep(0.05)
    return proc, addr_file.read_text().strip()


def _scrape(addr: str) -> tuple[float, int]:
    """(seconds, bytes) of one GET /metrics; a failed or timed-out scrape counts as 10 s, 0 B."""
    t0 = time.perf_counter()
    try:
        with urllib.request.urlopen(f"http://{addr}/metrics", timeout=10) as resp:
            size = len(resp.read())
    except OSError:
        return 10.0, 0
    return time.perf_counter() - t0, size


def export_tree(commit: str, tmp: Path) -> str:
    """The mfuscope packages of `commit` as an importable tree (`mfuscope/<layer>`): a collector
    of that commit runs from it, against the same payloads, in the same run."""
    root = tmp / f"tree-{commit}"
    (root / "mfuscope").mkdir(parents=True)
    (root / "mfuscope" / "__init__.py").write_text("")
    layers = ["core", "collector", "exporters", "cli", "agent", "integrations"]
    archive = subprocess.run(
        ["git", "-C", str(HERE.parent), "archive", commit, *layers],
        check=True,
        capture_output=True,
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(root / "mfuscope")], input=archive, check=True)
    return str(root)


def run_one(
    stack: str, world: int, args: argparse.Namespace, tmp: Path, payload: str, tree: str | None
) -> dict[str, Any]:
    rounds = max(2, args.duration // args.batch_every)
    shape = ["--world", str(world), "--rounds", str(rounds), "--batch-every", str(args.batch_every)]
    shape += ["--payload", payload]
    base_cmd = [sys.executable, str(LOADGEN), "baseline", *shape]
    base = json.loads(subprocess.check_output(base_cmd, preexec_fn=_pinned(0)))

    proc, addr = _start_collector(stack, tmp, args.per_rank_labels, tree)
    try:
        run = time.monotonic_ns()  # fresh names: a stale start time would skew every figure
        gen_out = tmp / f"gen-{stack}-{world}-{run}.json"
        t0_file = tmp / f"t0-{stack}-{world}-{run}"
        gen_cmd = [sys.executable, str(LOADGEN), "generate", *shape, "--addr", addr]
        gen_cmd += ["--t0-file", str(t0_file), "--out", str(gen_out)]
        gen = subprocess.Popen(gen_cmd)
        while not t0_file.exists():  # the generator builds its payloads first
            if gen.poll() is not None:
                raise RuntimeError(f"load generator failed with exit code {gen.returncode}")
            time.sleep(0.05)
        t0 = float(t0_file.read_text())
        while time.time() < t0:
            time.sleep(0.01)
        cpu0 = _cpu_s(proc.pid)
        rss_max = 0.0
        rss_samples: list[tuple[float, float]] = []
        scrapes: list[tuple[float, int]] = []
        next_scrape = t0 + args.batch_every
        while gen.poll() is None:
            now = time.time()
            rss_now = _rss_mb(proc.pid)
            rss_samples.append((now - t0, rss_now))
            rss_max = max(rss_max, rss_now)
            threads = _threads(proc.pid)
            if threads > MAX_THREADS or rss_max > MAX_RSS_MB:
                # A collapsing server (e.g. a thread per queued connection) would starve every
                # other process on a shared machine: stop the run and report the collapse.
                gen.kill()
                gen.wait()
                raise Collapsed(f"{stack}: {threads} threads, RSS {rss_max:.0f} MB")
            if now >= next_scrape:
                scrapes.append(_scrape(addr))
                next_scrape += 5
            time.sleep(0.5)
        wall = time.time() - t0
        cpu = _cpu_s(proc.pid) - cpu0
        rss_end = _rss_mb(proc.pid)
        # Quiet scrapes after the load: the collector's CPU per render is robust to a busy machine.
        cpu_before = _cpu_s(proc.pid)
        quiet = [_scrape(addr) for _ in range(QUIET_SCRAPES)]
        render_cpu = (_cpu_s(proc.pid) - cpu_before) / QUIET_SCRAPES
        scrapes += quiet
        if gen.returncode != 0:
            raise RuntimeError(f"load generator failed with exit code {gen.returncode}")
        out = json.loads(gen_out.read_text())
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    lat = out["latencies"]
    if len(lat) < 2:
        raise Collapsed(f"{len(lat)} answered, statuses {out['statuses']}, errors {out['errors']}")
    qs = statistics.quantiles(lat, n=100)
    render = [s for s, _ in scrapes]
    reports_per_s = out["accepted"] / wall
    return {
        "stack": stack,
        "collector": args.before if tree else "this checkout",
        "payload": payload,
        "ranks": world,
        "offered_reports_per_s": world * rounds * args.batch_every / wall,
        "accepted_reports_per_s": reports_per_s,
        "requests": sum(out["statuses"].values()),
        "statuses": out["statuses"],
        "connect_errors": out["errors"],
        "retries": out["retries"],
        "timeouts": out["timeouts"],
        "unsent_batches": out["unsent_batches"],
        "most_batches_waiting": out["most_batches_waiting"],
        "generator_lag_p99_s": out["lag_p99_s"],
        "core_use": cpu / wall,
        "cpu_per_report_s": cpu / max(out["accepted"], 1),
        "p50_s": qs[49],
        "p99_s": qs[98],
        "render_p50_s": statistics.median(render),
        "render_max_s": max(render),
        "render_cpu_s": render_cpu,
        "loadavg_1m": os.getloadavg()[0],
        "metrics_bytes": scrapes[-1][1],
        "rss_end_mb": rss_end,
        "rss_max_mb": rss_max,
        # RSS at the end of each quarter of the run (the last sample before the boundary).
        "rss_quarters_mb": [
            ([mb for t, mb in rss_samples if t <= wall * q / 4] or [0.0])[-1] for q in (1, 2, 3, 4)
        ],
        "baseline": base,
    }


def _print(r: dict[str, Any]) -> None:
    b = r["baseline"]
    print(
        f"\n== {r['stack']}, collector {r['collector']}, schema-{r['payload']} payloads, "
        f"{r['ranks']} ranks: {r['requests']} batches, statuses "
        f"{r['statuses']}, connect errors {r['connect_errors']}, generator lag p99 "
        f"{r['generator_lag_p99_s'] * 1e3:.1f} ms, load average {r['loadavg_1m']:.1f}"
    )
    print(
        f"backpressure: {r['retries']} re-sends (the agent's backoff; {r['timeouts']} after the "
        f"5 s request timeout), {r['unsent_batches']} batches still unsent a minute after the "
        f"last was made, at most {r['most_batches_waiting']} batches waiting in one rank's buffer "
        f"(an agent's holds 2,000 batches of 5 steps)"
    )
    print(
        f"accepted {r['accepted_reports_per_s']:.0f} reports/s (offered "
        f"{r['offered_reports_per_s']:.0f}); collector core use {r['core_use']:.1%}; "
        f"CPU/report {r['cpu_per_report_s'] * 1e6:.0f} us = "
        f"{r['cpu_per_report_s'] / b['cpu_per_report_s']:.1f}x bare json.loads "
        f"({b['cpu_per_report_s'] * 1e6:.1f} us); one core would take "
        f"{1 / r['cpu_per_report_s']:.0f} reports/s"
    )
    print(
        f"ingest latency p50 {r['p50_s'] * 1e3:.2f} ms ({r['p50_s'] / b['batch_p50_s']:.0f}x "
        f"decode of one batch, {b['batch_p50_s'] * 1e6:.0f} us), p99 {r['p99_s'] * 1e3:.2f} ms "
        f"({r['p99_s'] / b['batch_p99_s']:.0f}x, {b['batch_p99_s'] * 1e6:.0f} us)"
    )
    print(
        f"/metrics wall p50 {r['render_p50_s'] * 1e3:.1f} ms, max {r['render_max_s'] * 1e3:.1f} ms;"
        f" collector CPU per render {r['render_cpu_s'] * 1e3:.0f} ms "
        f"({r['render_cpu_s'] / b['round_s']:.3g}x decode of one batch per rank, "
        f"{b['round_s'] * 1e3:.1f} ms); {r['metrics_bytes']} bytes"
    )
    print(
        f"RSS at the end of each quarter of the run "
        f"{' / '.join(f'{mb:.1f}' for mb in r['rss_quarters_mb'])} MB (second half "
        f"{r['rss_quarters_mb'][3] - r['rss_quarters_mb'][1]:+.1f} MB), max "
        f"{r['rss_max_mb']:.1f} MB = {r['rss_max_mb'] / b['rss_mb']:.1f}x bare process holding "
        f"one decoded batch per rank ({b['rss_mb']:.1f} MB)"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", default="64,1024,4096", help="comma-separated job sizes")
    parser.add_argument("--stacks", default="aiohttp", help="aiohttp and/or stdlib")
    parser.add_argument("--duration", type=int, default=20, help="seconds per size (default 20)")
    parser.add_argument("--batch-every", type=int, default=5, help="seconds between batches")
    parser.add_argument("--per-rank-labels", action="store_true")
    parser.add_argument(
        "--payloads", default="1.2", help="comma-separated: 1.2 (today's agent) and/or 1.0"
    )
    parser.add_argument(
        "--before",
        metavar="COMMIT",
        help="also run the collector of COMMIT (git archive of this repository) on each size, "
        "just before this checkout's: before/after in the same run",
    )
    parser.add_argument("--json", action="store_true", help="also print raw results as JSON")
    args = parser.parse_args()
    if os.cpu_count() is None or len(os.sched_getaffinity(0)) < 2:
        print("needs 2 CPUs (collector on CPU 0, load generator on CPU 1)", file=sys.stderr)
        return 2
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        trees: list[str | None] = [None]
        if args.before:
            trees.insert(0, export_tree(args.before, Path(tmp)))
        for stack in args.stacks.split(","):
            for world in (int(w) for w in args.ranks.split(",")):
                for payload in args.payloads.split(","):
                    for tree in trees:
                        label = f"{stack}, {args.before if tree else 'this checkout'}, {payload}"
                        try:
                            result = run_one(stack, world, args, Path(tmp), payload, tree)
                        except Collapsed as exc:
                            print(f"\n== {label}, {world} ranks: FAILED, run stopped ({exc})")
                            sys.stdout.flush()
                            continue
                        _print(result)
                        sys.stdout.flush()
                        results.append(result)
    if args.json:
        print(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
