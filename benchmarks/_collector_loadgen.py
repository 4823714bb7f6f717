"""Payloads, bare-decode baseline and load generator of `collector_load.py` (run as a script).

    python benchmarks/_collector_loadgen.py baseline --world N --rounds R --batch-every S \
        [--payload 1.2|1.0]
    python benchmarks/_collector_loadgen.py generate --world N --rounds R --batch-every S \
        [--payload 1.2|1.0] --addr HOST:PORT --t0-file FILE --out FILE

Each simulated rank behaves like the agent (`agent/_sinks.py`, `agent/config.py`): one step per
second, one batch every `batch_every` seconds, one fresh connection per batch, gzip above 4 KiB;
every `PROFILE_EVERY`-th step is a profiled step carrying collectives. Payloads are today's
(schema 1.2): every batch carries the rank's collective records (traffic per op x axis, progress
per group, one arrival sample per group and step) and the compute split by kernel class, every
`HARDWARE_EVERY`-th batch its hardware counters; ``--payload 1.0`` sends step reports only, as a
schema-1.0 agent did.
"""

from __future__ import annotations

import argparse
import bisect
import collections
import gzip
import json
import os
import random
import resource
import selectors
import socket
import statistics
import sys
import time
from pathlib import Path
from typing import Any

GZIP_MIN_BYTES = 4096  # the agent's threshold (agent/_sinks.py)
PROFILE_EVERY = 10
HARDWARE_EVERY = 3  # batches between two hardware-counter records


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


# The process groups a rank of a 3-D (tp x pp x dp) job uses, named per group as PyTorch does
# (each tp group of 8 ranks its own name, ...): (group, axis, tier, size, collectives per step).
def _groups(world: int, rank: int) -> list[tuple[str, str, str, int, int]]:
    return [
        (f"tp{rank // 8}", "tp", "intra_node", 8, 24),
        (f"pp{rank // 2}", "pp", "inter_node", 2, 0),  # p2p only: no sequence numbers here
        (f"dp{rank % 16}", "dp", "inter_node", max(1, world // 16), 2),
        ("0", "world", "inter_node", world, 1),
    ]


# Cumulative traffic per (op, axis, tier, group size): (op, axis, tier, size, calls/step, bytes).
def _traffic_keys(world: int) -> list[tuple[str, str, str, int, int, int]]:
    dp = max(1, world // 16)
    return [
        ("all_gather", "tp", "intra_node", 8, 12, 33_554_432),
        ("reduce_scatter", "tp", "intra_node", 8, 12, 33_554_432),
        ("all_reduce", "dp", "inter_node", dp, 2, 104_857_600),
        ("send", "pp", "inter_node", 2, 4, 8_388_608),
        ("recv", "pp", "inter_node", 2, 4, 8_388_608),
        ("all_reduce", "world", "inter_node", world, 1, 8),
    ]


def _comm(world: int, rank: int, first_step: int, steps: int) -> dict[str, Any]:
    """The always-on collective records (schema 1.2) of a batch holding `steps` steps from
    `first_step`: cumulative traffic, progress per group, one arrival sample per group and step."""
    last = first_step + steps - 1
    start_ns = 1_763_700_000_000_000_000
    groups = [g for g in _groups(world, rank) if g[4]]
    return {
        "source": "flight_recorder",
        "durations": False,
        "status_interval_s": 10.0,
        "lost_total": 0,
        "p2p_recorded": False,
        "traffic": [
            {
                "op": op,
                "axis": axis,
                "tier": tier,
                "group_size": n,
                "calls": per * last,
                "bytes": per * last * size,
                "seconds": 0.0,
                "sized_seconds": 0.0,
                "sized_bytes": 0,
            }
            for op, axis, tier, n, per, size in _traffic_keys(world)
        ],
        "groups": [
            {
                "group": g,
                "axis": axis,
                "tier": tier,
                "size": n,
                "entered_seq": per * last,
                "completed_seq": per * last,
                "pending": None,
            }
            for g, axis, tier, n, per in groups
        ],
        "arrivals": [
            {
                "group": g,
                "seq": per * (s - 1) + 1,
                "enqueued_unix_ns": start_ns + s * 1_000_000_000 + 37_000 * (rank % 101),
            }
            for s in range(first_step, last + 1)
            for g, _, _, _, per in groups
        ],
    }


def _hardware(rank: int, batch_index: int) -> dict[str, Any]:
    elapsed = 1 + batch_index
    return {
        "memory_busy_ratio": 0.41,
        "sm_clock_ratio": 0.93,
        "power_watts": 655.0 + rank % 7,
        "energy_joules_total": 655.0 * 5 * elapsed,
        "links": [
            {"link": link, "direction": d, "bytes_total": 912_345_678 * elapsed}
            for link in ("nvlink", "pcie", "ib")
            for d in ("tx", "rx")
        ],
        "link_peaks": [
            {"link": "nvlink", "bytes_per_s": 4.5e11},
            {"link": "ib", "bytes_per_s": 5e10},
        ],
        "throttle": [{"reason": "sw_power_cap", "seconds_total": 0.5 * elapsed}],
    }


def batch_body(
    world: int, rank: int, first_step: int, steps: int, payload: str = "1.2"
) -> tuple[bytes, bool]:
    """One batch as the agent would send it: (body, gzipped). `payload` "1.2" is today's agent
    (collective records in every batch, hardware counters every `HARDWARE_EVERY` batches, the
    compute split by kernel class); "1.0" an agent of schema 1.0 (step reports only)."""
    rng = random.Random(rank * 1_000_003 + first_step)
    reports = [_report(rank, s, rng) for s in range(first_step, first_step + steps)]
    batch: dict[str, Any] = {
        "schema": "mfuscope.report",
        "version": payload,
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
        "reports": reports,
    }
    if payload != "1.0":
        batch_index = (first_step - 1) // steps
        batch["incarnation"] = "5f0c9a1e2b7d4c38"
        batch["node"] = f"node-{rank // 8}"
        for report in reports:
            wall = report["wall_s"]
            report["compute_classes"] = [
                {"kernel_class": k, "seconds": wall * f}
                for k, f in (("gemm", 0.4), ("attention", 0.12), ("elementwise_norm_reduce", 0.1))
            ]
        batch["comm"] = _comm(world, rank, first_step, steps)
        if batch_index % HARDWARE_EVERY == 0:
            batch["hardware"] = _hardware(rank, batch_index)
    body = json.dumps(batch, separators=(",", ":")).encode()
    if len(body) >= GZIP_MIN_BYTES:
        return gzip.compress(body, compresslevel=5), True
    return body, False


def all_bodies(
    world: int, rounds: int, batch_every: int, payload: str
) -> list[list[tuple[bytes, bool]]]:
    return [
        [batch_body(world, r, 1 + k * batch_every, batch_every, payload) for k in range(rounds)]
        for r in range(world)
    ]


# --- baseline: bare JSON decode of the same payloads, in a fresh process -------------------------


def _rss_mb(pid: int | str = "self") -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def baseline(world: int, rounds: int, batch_every: int, payload: str) -> dict[str, float]:
    """Bare `json.loads` of the same payloads (gunzipped first, untimed), timed in CPU time of
    this thread so a busy shared machine inflates it as little as possible. The RSS figure is
    taken first, holding one decoded batch per rank and nothing else."""
    first = [batch_body(world, r, 1, batch_every, payload) for r in range(world)]
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
        for rank in all_bodies(world, rounds, batch_every, payload)
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

    __slots__ = ("attempt", "due", "k", "rank", "received", "sent", "sock", "started", "wire")

    def __init__(self, due: float, wire: bytes, host: str, port: int, source: str) -> None:
        self.due = due
        self.wire = wire
        self.rank = self.k = self.attempt = 0
        self.sent = 0
        self.received: list[bytes] = []
        self.started = time.perf_counter()
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setblocking(False)
        if source:
            self.sock.bind((source, 0))
        self.sock.connect_ex((host, port))


def _wire(host: str, port: int, body: bytes, gz: bool) -> bytes:
    encoding = "Content-Encoding: gzip\r\n" if gz else ""
    head = (
        f"POST /v1/reports HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n{encoding}Connection: close\r\n\r\n"
    )
    return head.encode() + body


# The agent's retry policy (`agent/_transport.py`, `RetryPolicy` defaults): a batch whose send
# fails (connection refused or reset, 408/429/5xx) stays in the rank's buffer and is re-sent after
# min(max, base * 2**(attempt-1)) s, longer if the collector asks with Retry-After.
RETRY_BASE_S = 0.5
RETRY_MAX_S = 10.0
# After the last scheduled batch, how long failed batches are still retried before the run
# stops; those still unsent then are reported as such (an agent would go on retrying while its
# buffer, 10,000 reports by default, has room: it loses a batch only when the buffer is full).
DRAIN_S = 60.0
REQUEST_TIMEOUT_S = 5.0  # the agent's whole deadline of one send attempt
_RETRY_STATUS = frozenset({"408", "425", "429", "500", "502", "503", "504"})


def _source(host: str, rank: int) -> str:
    """The address a rank sends from: against a loopback collector, one 127.0.x.y per node of 8
    ranks, as ranks on different nodes would. From one address, the ~28,000 ephemeral ports run
    out: every connection the collector closes waits 60 s in TIME_WAIT, and 4,096 ranks open
    ~800 a second (a run started within a minute of another failed most of its connects)."""
    if not host.startswith("127."):
        return ""
    node = rank // 8
    return f"127.0.{node // 250 % 250}.{node % 250 + 1}"


def _retry_after(data: bytes) -> float:
    for line in data.split(b"\r\n\r\n", 1)[0].split(b"\r\n"):
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"retry-after" and value.strip().isdigit():
            return float(value.strip())
    return 0.0


def _generate(
    host: str, port: int, bodies: list[list[tuple[bytes, bool]]], batch_every: int, t0: float
) -> dict[str, Any]:
    """Send every rank's batches as its agent would: in order, one request at a time per rank
    (the agent's one transport thread), the rest waiting in the rank's buffer; a failed or
    timed-out send re-sent after the agent's backoff."""
    world = len(bodies)
    # (due, rank, k, attempt): attempt 0 a batch the rank makes, else a re-send of its oldest.
    schedule = [
        (t0 + batch_every * rank / world + k * batch_every, rank, k, 0)
        for rank in range(world)
        for k in range(len(bodies[rank]))
    ]
    schedule.sort(reverse=True)  # pop() from the end = earliest first
    give_up = schedule[0][0] + DRAIN_S
    sel = selectors.DefaultSelector()
    latencies: list[float] = []
    lags: list[float] = []
    statuses: dict[str, int] = {}
    accepted = errors = retries = unsent = timeouts = 0
    buffers: list[collections.deque[int]] = [collections.deque() for _ in range(world)]
    busy = [False] * world  # a request in flight, or a re-send waiting for its time
    most_waiting = 0  # the most batches one rank held unsent at once
    inflight: dict[socket.socket, _Request] = {}

    def start(rank: int, attempt: int) -> None:
        k = buffers[rank][0]
        body, gz = bodies[rank][k]
        req = _Request(0.0, _wire(host, port, body, gz), host, port, _source(host, rank))
        req.rank, req.k, req.attempt = rank, k, attempt
        busy[rank] = True
        sel.register(req.sock, selectors.EVENT_WRITE, req)
        inflight[req.sock] = req

    def done(rank: int) -> None:
        buffers[rank].popleft()
        busy[rank] = False
        if buffers[rank]:
            start(rank, 0)

    def retry(req: _Request, delay: float) -> None:
        nonlocal retries, unsent
        due = time.time() + min(RETRY_MAX_S, max(delay, RETRY_BASE_S * 2**req.attempt))
        if due > give_up:
            unsent += 1
            done(req.rank)
            return
        retries += 1
        bisect.insort(schedule, (due, req.rank, req.k, req.attempt + 1), key=lambda e: -e[0])

    def finish(req: _Request, failed: bool) -> None:
        nonlocal accepted, errors
        sel.unregister(req.sock)
        req.sock.close()
        del inflight[req.sock]
        data = b"".join(req.received)
        parts = data.split(b" ", 2)
        if failed or len(parts) < 3 or not parts[1].isdigit():
            errors += 1
            retry(req, 0.0)
            return
        latencies.append(time.perf_counter() - req.started)
        status = parts[1].decode()
        statuses[status] = statuses.get(status, 0) + 1
        if status in _RETRY_STATUS:
            retry(req, _retry_after(data))
            return
        if status == "200":
            accepted += json.loads(data.split(b"\r\n\r\n", 1)[1])["accepted"]
        done(req.rank)

    while schedule or inflight:
        now = time.time()
        while schedule and schedule[-1][0] <= now:
            due, rank, k, attempt = schedule.pop()
            if attempt:
                start(rank, attempt)
                continue
            lags.append(now - due)
            buffers[rank].append(k)
            most_waiting = max(most_waiting, len(buffers[rank]))
            if not busy[rank]:
                start(rank, 0)
        late = time.perf_counter() - REQUEST_TIMEOUT_S
        for req in [r for r in inflight.values() if r.started < late]:
            timeouts += 1
            finish(req, failed=True)
        timeout = min(0.05, max(0.0, schedule[-1][0] - now)) if schedule else 0.05
        for key, events in sel.select(timeout):
            req = key.data
            if req.sock not in inflight:
                continue
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
        "timeouts": timeouts,
        "retries": retries,
        "unsent_batches": unsent,
        "most_batches_waiting": most_waiting,
    }


def generator_main(args: argparse.Namespace) -> None:
    """Build every payload first, then start one second later and tell the orchestrator when
    (`--t0-file`): building 4,096 ranks' payloads for a long run takes many seconds, and a late
    start would turn the first rounds into one burst."""
    os.sched_setaffinity(0, {1})
    # One connection per rank at most: 8,192 ranks need more than the default 1,024 files.
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    bodies = all_bodies(args.world, args.rounds, args.batch_every, args.payload)
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
    parser.add_argument("--payload", default="1.2", choices=["1.2", "1.0"])
    parser.add_argument("--addr")
    parser.add_argument("--t0-file")
    parser.add_argument("--out")
    args = parser.parse_args()
    if args.mode == "baseline":
        json.dump(baseline(args.world, args.rounds, args.batch_every, args.payload), sys.stdout)
    else:
        generator_main(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
