"""CPU cost of the agent's flight-recorder reader, and what it does to the calling thread, at 100
and 10,000 collectives per second.

    .venv/bin/python benchmarks/collective_reader_load.py [--rounds 4] [--block-s 3]

One process, a single-rank gloo group: the main thread (the "training thread") issues tiny
all_reduces at a paced rate while the agent's reader (`CollectiveReader`, its default interval of
5 s, shortened when the ring would fill a quarter of itself) reads PyTorch's flight recorder on
its own thread. Blocks with the reader reading and paused alternate in a rotating order, at each
rate, so that machine load hits both alike; a reading block starts after the reader's first read
since its pause (which catches up on the paused block). Printed per rate: the reader's CPU time
as a share of one core while it read, its reads per second, entries taken and lost, and the main
thread's time per collective (median, p99, max) with the reader reading against paused; and
which dump the reader used (``native``: the C++ dump with the GIL released; else the binding).
``--ring N`` sets ``TORCH_FR_BUFFER_SIZE`` (default: PyTorch's 2,000 entries).
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import time

RATES = (100, 10_000)


def _quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(int(q * len(ordered)), len(ordered) - 1)]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _block(rate: int, seconds: float, tensor: object) -> list[float]:
    """Issue all_reduces at `rate` per second for `seconds`; the time each one took (s)."""
    import torch.distributed as dist

    period = 1.0 / rate
    took = []
    start = time.perf_counter()
    next_at = start
    while (now := time.perf_counter()) - start < seconds:
        if now < next_at:
            # Waiting releases the GIL, as a training thread does inside its ops; a Python spin
            # would hold it and starve every other thread (the reader's chunks included).
            time.sleep(next_at - now - 0.001 if next_at - now > 0.002 else 0)
            continue
        t0 = time.perf_counter()
        dist.all_reduce(tensor)  # type: ignore[arg-type]
        took.append(time.perf_counter() - t0)
        next_at += period
    return took


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--block-s", type=float, default=12.0, help="a few reads at 5 s apart")
    parser.add_argument("--ring", type=int, default=2000, help="flight-recorder entries")
    args = parser.parse_args()
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()))
    os.environ["TORCH_FR_BUFFER_SIZE"] = str(args.ring)
    import torch
    import torch.distributed as dist
    from mfuscope.agent._health import RateLimitedLog
    from mfuscope.agent._periodic import Periodic
    from mfuscope.agent.collective_reader import CollectiveReader
    from mfuscope.agent.flight_recorder import dump_sources, ring_entries
    from mfuscope.core.flight_accounting import GroupName

    dist.init_process_group("gloo", rank=0, world_size=1)
    tensor = torch.ones(16)
    sources = dump_sources()
    reader = CollectiveReader(
        sources,
        lambda group, desc: GroupName("world", "intra_node", 1),
        log=RateLimitedLog(60.0),
        ring_entries=ring_entries(),
    )
    reader.baseline()
    reader.pause()
    reader.start(Periodic(RateLimitedLog(60.0), clock=time.monotonic))  # a daemon thread
    used = ", ".join(f"{s.name} ({'native' if s.native else 'binding'})" for s in sources)
    print(
        f"flight-recorder reader load: single-rank gloo, ring {ring_entries()} entries, dump "
        f"{used}, {args.rounds} rounds x {args.block_s:g} s per mode and rate"
    )
    _block(1000, 1.0, tensor)  # warm-up: fills the ring
    for rate in RATES:
        took: dict[str, list[float]] = {"paused": [], "reading": []}
        cpu_s = active_s = 0.0
        reads = taken = lost = 0
        for round_index in range(args.rounds):
            for mode in ("paused", "reading") if round_index % 2 else ("reading", "paused"):
                if mode == "reading":
                    # The first read after a pause catches up on the paused block (whose
                    # entries the ring overwrote): wait for it, then count from there.
                    reads_before = reader.reads
                    reader.resume()
                    while reader.reads == reads_before:
                        time.sleep(0.01)
                    cpu0, reads0, taken0 = reader.cpu_s, reader.reads, reader.taken
                    lost0 = reader.records().lost_total
                    started = time.perf_counter()
                took[mode] += _block(rate, args.block_s, tensor)
                if mode == "reading":
                    reader.pause()
                    time.sleep(0.2)  # let a read in progress finish before counting
                    active_s += time.perf_counter() - started
                    cpu_s += reader.cpu_s - cpu0
                    reads += reader.reads - reads0
                    taken += reader.taken - taken0
                    lost += reader.records().lost_total - lost0
        achieved = len(took["reading"]) / (args.rounds * args.block_s)
        print(
            f"{rate:>6}/s (achieved {achieved:.0f}/s): reader CPU {cpu_s / active_s:.4f} of one "
            f"core, {reads / active_s:.1f} reads/s, {taken} entries taken, {lost} lost; longest "
            f"stretch holding the GIL {reader.longest_hold_s * 1e3:.2f} ms"
        )
        reader.longest_hold_s = 0.0
        for mode, values in took.items():
            median_us = statistics.median(values) * 1e6
            p99_us = _quantile(values, 0.99) * 1e6
            print(
                f"        main thread per all_reduce, reader {mode:<7}: median {median_us:.0f} us, "
                f"p99 {p99_us:.0f} us, max {max(values) * 1e3:.2f} ms ({len(values)} calls)"
            )
    reader.close(1.0)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
