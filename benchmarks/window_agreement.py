"""Window agreement at thousands of ranks: what a check step costs each rank's training thread,
against a real `torch.distributed.TCPStore` server.

    RES_OPTIONS="timeout:1 attempts:1" .venv/bin/python benchmarks/window_agreement.py \\
        --ranks 1024 4096 --procs 16 --windows 4

A window every 16 steps of `--step-s` (a stress cadence: real windows are hundreds of steps
apart), so each window takes four decisions, at its first step and 8, 12 and 14 steps after it
(the agent's halving chain). Two modes, interleaved in one run against the same server:

- ``round-trips`` (the baseline, the protocol before rank 0 decided alone): at each check step
  every rank, on its training thread, reads the latest window cost (``check`` + ``get``) and
  offers a start with ``compare_set`` (the cheapest check step that protocol had: a postponement
  read another key); at the step after a window it publishes its cost and marks the window done
  (``compare_set`` + ``add``).
- ``agent``: the agent's own code (`AlignedSchedule` over `BackgroundAgreement`, with a second
  store connection per rank as in the agent): rank 0 decides and publishes, every other rank asks
  for the decision at the check step and reads it at the next step; costs and done marks are
  published off the training thread.

Ranks: `--procs` processes each run a share of the ranks, each rank with its own store
connections (4,096 processes that each import torch do not fit on a small machine): in
``round-trips`` mode one thread per rank (its round trips block it), in ``agent`` mode one thread
steps all of the process's ranks in turn (their training-thread part never blocks; each rank
still has its own periodic thread and connection). Two *probe* ranks run in processes of their
own, rank 0 (the decider) and the last rank (a follower), raised to real-time scheduling where
the system allows (printed). Every rank's step starts at the
same instant (a shared start time and step period), so every rank hits the store at once, as the
ranks of a synchronous job do. Printed per size and mode, for the probes and for all ranks: the
training thread's time at check steps (wall time, and the thread's own CPU time) and at the step
after each (p50 / p99 / max over ranks and check steps, the first window left out as warm-up);
the store server's CPU time per check step (from /proc); for ``agent`` the time from rank 0's
publish to a follower having the answer and the windows followers learnt of too late.

The other ranks' wall times include waiting for their process's GIL (shared by a few hundred
ranks' threads) and for the machine's cores (shared by every rank, the server and other work):
they overstate what a rank on its own host sees. The probes share neither a GIL nor, when real-time,
the queue for a core: their times are the per-rank figures. In ``round-trips`` mode the server's
CPU per check step is also a floor for the last rank's wait (one server thread answers every
request in turn).

Reverse DNS: the store logs each connection's peer name; where no DNS server answers (sandboxes)
each lookup can stall for the resolver's timeout, so set ``RES_OPTIONS="timeout:1 attempts:1"``
(set-up only: no lookups happen while steps are measured).
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import statistics
import sys
import threading
import time
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

MODES = ("round-trips", "agent")
EVERY = 16  # steps between window starts
CHECK_OFFSETS = (0, 8, 12, 14)  # decisions of a window, steps after its start (see above)
COST_S = 0.001  # each rank's published window cost: far under the budget, so it binds nothing
TIMEOUT = timedelta(seconds=600)


@dataclass
class RankRecord:
    """One rank's measurements in one phase (seconds)."""

    check_s: list[float] = field(default_factory=list)  # training-thread time at check steps
    after_s: list[float] = field(default_factory=list)  # ... at the step after each
    check_cpu_s: list[float] = field(default_factory=list)  # that thread's CPU time in them
    arrived: dict[str, float] = field(default_factory=dict)  # decision key -> answer in (agent)
    published: dict[str, float] = field(default_factory=dict)  # key -> publish call (rank 0)
    missed: int = 0
    failure: str | None = None


def _serve(ready: Any) -> None:
    import torch.distributed as dist

    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=TIMEOUT)
    ready.put(store.port)
    while True:
        time.sleep(3600)


def _cpu_s(pid: int) -> float:
    """User + system CPU seconds of process `pid` so far (proc(5), fields 14 and 15)."""
    with open(f"/proc/{pid}/stat", encoding="ascii") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _client(port: int) -> Any:
    import torch.distributed as dist

    return dist.TCPStore("127.0.0.1", port, is_master=False, timeout=TIMEOUT)


class _RoundTrips:
    """The baseline: the store round trips the former protocol made on the training thread."""

    def __init__(self, port: int, rank: int, prefix: str) -> None:
        self.store = _client(port)
        self.rank = rank
        self.prefix = prefix

    def step(self, step: int, record: RankRecord, measured: bool) -> None:
        window, offset = divmod(step, EVERY)
        start, cpu = time.perf_counter(), time.thread_time()
        if offset in CHECK_OFFSETS:  # read the latest cost, offer the next start
            cost = f"{self.prefix}/cost/{window - 1}"
            if self.store.check([cost]):
                self.store.get(cost)
            self.store.compare_set(f"{self.prefix}/start/{step}", "", str(window + EVERY))
        elif offset == 1:  # publish the window's cost, mark it done
            self.store.compare_set(f"{self.prefix}/cost/{window}", "", repr(COST_S))
            self.store.add(f"{self.prefix}/done/{window}", 1)
        _note(record, step, measured, start, cpu)


class _Agent:
    """The agent's schedule and background agreement, as `agent/_runtime.py` builds them."""

    def __init__(self, port: int, rank: int, world: int, prefix: str) -> None:
        from mfuscope.agent._store_agreement import BackgroundAgreement, StoreAgreement, own_client
        from mfuscope.agent._window_schedule import AlignedSchedule, RankView, ScheduleParams

        self.store = _client(port)  # stands for torch.distributed's own connection, idle
        timed = _timed_agreement(BackgroundAgreement)
        self.agreement = timed(lambda: StoreAgreement(own_client(self.store), prefix))
        params = ScheduleParams(
            first_window_step=0,
            every_steps=EVERY,
            every_s=1e9,
            window_steps=1,
            max_overhead_ratio=1,
        )
        self.schedule = AlignedSchedule(params, self.agreement, members=world, decider=rank == 0)
        self.view = RankView(step_s=1.0, cost_s=COST_S)
        self.store.set(f"{prefix}/ready/{rank}", "1")
        self.agreement.fetch(f"ready/{rank}")  # connected once this is in

    def ready(self, rank: int) -> bool:
        return self.agreement.fetched(f"ready/{rank}") is not None

    def step(self, step: int, record: RankRecord, measured: bool) -> None:
        schedule = self.schedule
        start, cpu = time.perf_counter(), time.thread_time()
        opens = schedule.opens_at(step)
        schedule.step_ended(step, lambda: self.view)
        schedule.window_done()
        if opens:
            schedule.record_cost(step, COST_S)
        _note(record, step, measured, start, cpu)

    def finish(self, record: RankRecord) -> None:
        record.arrived = dict(self.agreement.arrived)
        record.published = dict(self.agreement.published)
        record.missed = self.schedule.missed
        record.failure = self.schedule.failure
        self.schedule.close()


def _note(record: RankRecord, step: int, measured: bool, start: float, cpu: float) -> None:
    """Record a check step's (or the step after's) wall time on the training thread, and at
    check steps its CPU time."""
    elapsed, cpu_s = time.perf_counter() - start, time.thread_time() - cpu
    offset = step % EVERY
    if not measured:
        return
    if offset in CHECK_OFFSETS:
        record.check_s.append(elapsed)
        record.check_cpu_s.append(cpu_s)
    elif offset - 1 in CHECK_OFFSETS:
        record.after_s.append(elapsed)


def _timed_agreement(base: Any) -> Any:
    """`BackgroundAgreement` noting when rank 0 publishes and when a follower's answer is in."""

    class Timed(base):  # type: ignore[misc, valid-type]
        def __init__(self, connect: Any) -> None:
            from mfuscope.agent._health import RateLimitedLog
            from mfuscope.agent._periodic import Periodic

            self.arrived: dict[str, float] = {}
            self.published: dict[str, float] = {}
            # Each rank's store calls on a periodic thread of its own, as in the agent.
            super().__init__(connect, Periodic(RateLimitedLog(60.0), clock=time.monotonic))

        def publish(self, key: str, value: int) -> None:
            self.published[key] = time.perf_counter()
            super().publish(key, value)

        def _look(self, agreement: Any) -> float:
            before = set(self._answers)
            pause: float = super()._look(agreement)
            now = time.perf_counter()
            for key in self._answers.keys() - before:
                self.arrived[key] = now
            return pause

    return Timed


def _realtime() -> str:
    """Raise this process to real-time scheduling if allowed; what was applied."""
    try:
        os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(1))
        return "SCHED_FIFO"
    except (AttributeError, OSError):
        return "normal scheduling (SCHED_FIFO not allowed)"


@dataclass(frozen=True)
class _Shared:
    """What every worker process gets: the job's size, the server, the phases and the means to
    keep in step (a barrier with the main process, the start time and step period it sets)."""

    world: int
    port: int
    windows: int
    phases: tuple[tuple[str, str], ...]
    barrier: Any
    start_at: Any
    period: Any
    out: Any


def _worker(ranks: list[int], shared: _Shared, probe: bool) -> None:
    """Run `ranks` as threads through every phase (mode, key prefix), in step with the others;
    a `probe` process (one rank) runs at real-time priority where allowed."""
    scheduling = _realtime() if probe else "normal"
    for mode, prefix in shared.phases:
        records = _phase(mode, prefix, ranks, shared)
        shared.out.put((mode, records, probe, scheduling))


def _phase(mode: str, prefix: str, ranks: list[int], shared: _Shared) -> dict[int, RankRecord]:
    records = {rank: RankRecord() for rank in ranks}
    actors: dict[int, Any] = {}

    def build(rank: int) -> None:
        if mode == "agent":
            actors[rank] = _Agent(shared.port, rank, shared.world, prefix)
        else:
            actors[rank] = _RoundTrips(shared.port, rank, prefix)

    _run_threads(build, ranks)
    for rank, actor in actors.items():
        while mode == "agent" and not actor.ready(rank):
            time.sleep(0.01)
    shared.barrier.wait()  # every rank connected; the main process reads the server's CPU
    shared.barrier.wait()  # ... and sets the start time
    t0, step_s = shared.start_at.value, shared.period.value

    def run(group: list[int]) -> None:
        for step in range(EVERY * shared.windows):
            delay = t0 + step * step_s - time.perf_counter()
            if delay > 0:
                time.sleep(delay)
            for rank in group:
                actors[rank].step(step, records[rank], measured=step >= EVERY)

    if mode == "agent":  # the training thread's part never blocks: one thread steps them all
        run(ranks)
    else:  # each rank's round trips block it: one thread per rank, all at once
        _run_threads(lambda rank: run([rank]), ranks)
    shared.barrier.wait()  # every step done; the main process reads the server's CPU again
    for rank, actor in actors.items():
        if mode == "agent":
            actor.finish(records[rank])
    return records


def _run_threads(target: Any, ranks: list[int]) -> None:
    threads = [threading.Thread(target=target, args=(rank,)) for rank in ranks]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


def _percentiles(values: list[float]) -> tuple[float, float, float]:
    """p50, p99 and max (NaN for none)."""
    ordered = sorted(values)
    if not ordered:
        return (float("nan"),) * 3
    p99 = ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]
    return statistics.median(ordered), p99, ordered[-1]


def _ms(triple: tuple[float, float, float]) -> str:
    return " / ".join(f"{v * 1e3:.3f}" for v in triple)


def _line(label: str, records: list[RankRecord]) -> str:
    check = _percentiles([v for r in records for v in r.check_s])
    cpu = _percentiles([v for r in records for v in r.check_cpu_s])
    after = _percentiles([v for r in records for v in r.after_s])
    return f"    {label:<34} check step {_ms(check)}  (CPU {_ms(cpu)})  step after {_ms(after)}"


def _measure(world: int, args: argparse.Namespace, port: int, server_pid: int) -> None:
    ctx = mp.get_context("spawn")
    modes = [m for _ in range(args.rounds) for m in MODES]
    phases = [(mode, f"bench/{world}/{i}") for i, mode in enumerate(modes)]
    probes = [0, world - 1]
    rest = list(range(1, world - 1))
    shares = [rest[i :: args.procs] for i in range(args.procs) if rest[i :: args.procs]]
    groups = [([rank], True) for rank in probes] + [(share, False) for share in shares]
    barrier = ctx.Barrier(len(groups) + 1)
    start_at = ctx.Value("d", 0.0)
    shared = _Shared(
        world, port, args.windows, tuple(phases), barrier, start_at, ctx.Value("d", args.step_s),
        ctx.Queue(),
    )  # fmt: skip
    workers = [
        ctx.Process(target=_worker, args=(group, shared, probe), daemon=True)
        for group, probe in groups
    ]
    for process in workers:
        process.start()
    checks = len(CHECK_OFFSETS) * args.windows
    for mode, _ in phases:
        barrier.wait()
        cpu_before = _cpu_s(server_pid)
        start_at.value = time.perf_counter() + 1.0
        barrier.wait()
        barrier.wait()
        server_cpu_s = _cpu_s(server_pid) - cpu_before
        records: dict[int, RankRecord] = {}
        scheduling = "normal"
        for _ in workers:
            _, got, probe, applied = shared.out.get()
            records.update(got)
            scheduling = applied if probe else scheduling
        print(
            f"{world} ranks, {mode}: server CPU per check step {server_cpu_s / checks * 1e3:.1f} ms"
            "; times in ms, p50 / p99 / max",
            flush=True,
        )
        print(_line(f"rank 0, own process, {scheduling}", [records[0]]))
        print(_line(f"rank {world - 1}, own process, {scheduling}", [records[world - 1]]))
        print(_line(f"all {world} ranks", list(records.values())))
        if mode == "agent":
            published = records[0].published
            fetch = [
                at - published[key]
                for rank, r in records.items()
                if rank != 0
                for key, at in r.arrived.items()
                if key in published
            ]
            late = sum(r.missed for r in records.values())
            failed = sum(1 for r in records.values() if r.failure)
            print(
                f"    answer in after rank 0 publishes {_ms(_percentiles(fetch))}; windows "
                f"learnt of too late {late} (of {(world - 1) * (args.windows - 1)}); "
                f"failed ranks {failed}",
                flush=True,
            )
    for process in workers:
        process.join(timeout=60)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, nargs="+", default=[1024, 4096])
    parser.add_argument("--procs", type=int, default=16, help="processes sharing the rank threads")
    parser.add_argument("--windows", type=int, default=4, help="windows per phase (4 checks each)")
    parser.add_argument("--rounds", type=int, default=1, help="times each mode runs, interleaved")
    parser.add_argument("--step-s", type=float, default=0.5, help="step period (s)")
    args = parser.parse_args()
    ctx = mp.get_context("spawn")
    ready = ctx.Queue()
    server = ctx.Process(target=_serve, args=(ready,), daemon=True)
    server.start()
    port = ready.get(timeout=120)
    print(
        f"TCPStore server pid {server.pid} port {port}; {os.cpu_count()} CPUs; "
        f"load average {os.getloadavg()[0]:.1f}",
        flush=True,
    )
    assert server.pid is not None
    for world in args.ranks:
        _measure(world, args, port, server.pid)
    server.terminate()


if __name__ == "__main__":
    main()
