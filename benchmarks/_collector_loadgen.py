"""Payloads, bare-decode baseline and load generator of `collector_load.py` (run as a script).

    python benchmarks/_collector_loadgen.py baseline --world N --rounds R --batch-every S
    python benchmarks/_collector_loadgen.py generate --world N --rounds R --batch-every S \
        --addr HOST:PORT --t0-file FILE --out FILE

Each simulated rank behaves like the agent (`agent/sinks.py`, `agent/config.py`): one step per
second, one batch every `batch_every` seconds, one fresh connection per batch, gzip above 4 KiB;
every `PROFILE_EVERY`-th step is a profiled step carrying collectives.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import random
import selectors
import socket
import statistics
import sys
import time
from pathlib import Path
from typing import Any

GZIP_MIN_BYTES = 4096  # the agent's threshold (agent/sinks.py)
PROFILE_EVERY = 10


# --- payloads (deterministic, so every process builds the same bytes) ----------------------------


def _report(rank: int, step: int, rng: random.Random) -> dict[str, Any]:
    wall = 1.0 + 0.02 * rng.random() + (0.15 if rank % 97 == 7 else 0.0)
    fractions = {"compute": 0.62, "recompute": 0.08, "other": 0.03, "bubble_idle": 0.05}
    components = [
        {"component": name, "seconds": wall * f, "axis": "", "tier": ""}
        for name, f in fractions.items()
    ]
    components.append(
        {"component": "exposed_comm", "axis": "dp", "tier": "inter_node", "seconds": wall * 0.12}
    )
    components.append(
        {"component": "exposed_comm", "axis": "tp", "tier": "intra_node", "seconds": 0.0}
    )
    components[-1]["seconds"] = wall - sum(c["seconds"] for c in components[:-1])
    report: dict[str, Any] = {
        "step": step,
        "start_unix_ns": 1_763_700_000_000_000_000 + step * 1_000_000_000,
        "wall_s": wall,
        "model_flops": 3.1e14,
        "recompute_flops": 4.0e13,
        "breakdown_step": step - step % PROFILE_EVERY,
        "components": components,
        "overlapped_comm_s": 0.3,
    }
    if step % PROFILE_EVERY == 0:
        report["collectives"] = [
            {
                "op": op,
                "axis": axis,
                "tier": tier,
                "group_size": n,
                "bytes": size,
                "count": 4,
                "seconds": 0.05 + 0.01 * rng.random(),
                "overlapped_s": 0.02,
            }
            for op, axis, tier, n, size in (
                ("all_reduce", "dp", "inter_node", 512, 104_857_600),
                ("all_gather", "tp", "intra_node", 8, 33_554_432),
                ("reduce_scatter", "tp", "intra_node", 8, 33_554_432),
                ("send", "pp", "inter_node", 2, 8_388_608),
            )
        ]
    return report


def batch_body(world: int, rank: int, first_step: int, steps: int) -> tuple[bytes, bool]:
    """One batch as the agent would send it: (body, gzipped)."""
    rng = random.Random(rank * 1_000_003 + first_step)
    batch = {
        "schema": "mfuscope.report",
        "version": "1.0",
        "job": f"bench-{world}",
        "rank": rank,
        "world_size": world,
        "local_rank": rank % 8,
        "host": f"node-{rank // 8}",
        "device": "NVIDIA H100 80GB HBM3",
        "peak_flops": 9.89e14,
        "peak_source": "spec",
        "sent_unix_ns": 1_763_700_000_000_000_000,
        "health": {"reports_dropped_total": 0, "send_failures_total": 0},
        "topology": {
            "groups": [
                {
                    "axis": "tp",
                    "tier": "intra_node",
                    "size": 8,
                    "spans_hosts": False,
                    "link_peak_bytes_per_s": 4.5e11,
                },
                {
                    "axis": "dp",
                    "tier": "inter_node",
                    "size": world // 8 or 1,
                    "spans_hosts": True,
                    "link_peak_bytes_per_s": 5.0e10,
                },
            ]
        },
        "reports": [_report(rank, s, rng) for s in range(first_step, first_step + steps)],
    }
    body = json.dumps(batch, separators=(",", ":")).encode()
    if len(body) >= GZIP_MIN_BYTES:
        return gzip.compress(body, compresslevel=5), True
    return body, False


def all_bodies(world: int, rounds: int, batch_every: int) -> list[list[tuple[bytes, bool]]]:
    return [
        [batch_body(world, r, 1 + k * batch_every, batch_every) for k in range(rounds)]
        for r in range(world)
    ]


# --- baseline: bare JSON decode of the same payloads, in a fresh process -------------------------


def _rss_mb(pid: int | str = "self") -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def baseline(world: int, rounds: int, batch_every: int) -> dict[str, float]:
    """Bare `json.loads` of the same payloads (gunzipped first, untimed), timed in CPU time of
    this thread so a busy shared machine inflates it as little as possible. The RSS figure is
    taken first, holding one decoded batch per rank and nothing else."""
    first = [batch_body(world, r, 1, batch_every) for r in range(world)]
    first_raw = [gzip.decompress(b) if gz else b for b, gz in first]
    del first
    clock = time.thread_time
    t0 = clock()
    held = [json.loads(body) for body in first_raw]  # one decoded batch per rank, kept alive
    round_s = clock() - t0
    rss_mb = _rss_mb()
    del held, first_raw

    raw = [
        gzip.decompress(b) if gz else b
        for rank in all_bodies(world, rounds, batch_every)
        for b, gz in rank
    ]
    per_batch = []
    reports = 0
    cpu0 = clock()
    for body in raw:
        t0 = clock()
        decoded = json.loads(body)
        per_batch.append(clock() - t0)
        reports += len(decoded["reports"])
    cpu = clock() - cpu0
    qs = statistics.quantiles(per_batch, n=100)
    return {
        "cpu_per_report_s": cpu / reports,
        "batch_p50_s": qs[49],
        "batch_p99_s": qs[98],
        "round_s": round_s,
        "rss_mb": rss_mb,
    }


# --- load generator -------------------------------------------------------------------------------


class _Request:
    """One batch in flight on a non-blocking socket (selectors: far cheaper than asyncio streams,
    so one generator core can offer 4,096 ranks' load)."""

    __slots__ = ("due", "received", "sent", "sock", "started", "wire")

    def __init__(self, due: float, wire: bytes, host: str, port: int) -> None:
        self.due = due
        self.wire = wire
        self.sent = 0
        self.received: list[bytes] = []
        self.started = time.perf_counter()
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setblocking(False)
        self.sock.connect_ex((host, port))


def _wire(host: str, port: int, body: bytes, gz: bool) -> bytes:
    encoding = "Content-Encoding: gzip\r\n" if gz else ""
    head = (
        f"POST /v1/reports HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n{encoding}Connection: close\r\n\r\n"
    )
    return head.encode() + body


def _generate(
    host: str, port: int, bodies: list[list[tuple[bytes, bool]]], batch_every: int, t0: float
) -> dict[str, Any]:
    world = len(bodies)
    schedule = [
        (t0 + batch_every * rank / world + k * batch_every, rank, k)
        for rank in range(world)
        for k in range(len(bodies[rank]))
    ]
    schedule.sort(reverse=True)  # pop() from the end = earliest first
    sel = selectors.DefaultSelector()
    latencies: list[float] = []
    lags: list[float] = []
    statuses: dict[str, int] = {}
    accepted = errors = 0
    inflight = 0

    def finish(req: _Request, failed: bool) -> None:
        nonlocal accepted, errors, inflight
        sel.unregister(req.sock)
        req.sock.close()
        inflight -= 1
        data = b"".join(req.received)
        parts = data.split(b" ", 2)
        if failed or len(parts) < 3 or not parts[1].isdigit():
            errors += 1
            return
        latencies.append(time.perf_counter() - req.started)
        status = parts[1].decode()
        statuses[status] = statuses.get(status, 0) + 1
        if status == "200":
            accepted += json.loads(data.split(b"\r\n\r\n", 1)[1])["accepted"]

    while schedule or inflight:
        now = time.time()
        while schedule and schedule[-1][0] <= now:
            due, rank, k = schedule.pop()
            lags.append(now - due)
            body, gz = bodies[rank][k]
            req = _Request(due, _wire(host, port, body, gz), host, port)
            sel.register(req.sock, selectors.EVENT_WRITE, req)
            inflight += 1
        timeout = min(0.05, max(0.0, schedule[-1][0] - now)) if schedule else 0.05
        for key, events in sel.select(timeout):
            req = key.data
            try:
                if events & selectors.EVENT_WRITE:
                    req.sent += req.sock.send(req.wire[req.sent :])
                    if req.sent == len(req.wire):
                        sel.modify(req.sock, selectors.EVENT_READ, req)
                elif events & selectors.EVENT_READ:
                    chunk = req.sock.recv(65536)
                    if chunk:
                        req.received.append(chunk)
                    else:
                        finish(req, failed=False)
            except OSError:
                finish(req, failed=True)
    return {
        "latencies": latencies,
        "lag_p99_s": statistics.quantiles(lags, n=100)[98] if len(lags) > 1 else 0.0,
        "statuses": statuses,
        "accepted": accepted,
        "errors": errors,
    }


def generator_main(args: argparse.Namespace) -> None:
    """Build every payload first, then start one second later and tell the orchestrator when
    (`--t0-file`): building 4,096 ranks' payloads for a long run takes many seconds, and a late
    start would turn the first rounds into one burst."""
    os.sched_setaffinity(0, {1})
    bodies = all_bodies(args.world, args.rounds, args.batch_every)
    host, port = args.addr.rsplit(":", 1)
    t0 = time.time() + 1.0
    tmp = Path(args.t0_file + ".tmp")
    tmp.write_text(repr(t0))
    tmp.replace(args.t0_file)
    result = _generate(host, int(port), bodies, args.batch_every, t0)
    Path(args.out).write_text(json.dumps(result))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("mode", choices=["baseline", "generate"])
    parser.add_argument("--world", type=int, required=True)
    parser.add_argument("--rounds", type=int, required=True)
    parser.add_argument("--batch-every", type=int, required=True)
    parser.add_argument("--addr")
    parser.add_argument("--t0-file")
    parser.add_argument("--out")
    args = parser.parse_args()
    if args.mode == "baseline":
        json.dump(baseline(args.world, args.rounds, args.batch_every), sys.stdout)
    else:
        generator_main(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
