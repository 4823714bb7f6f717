"""validate-gpu's flight-recorder probe: the agent's always-on collective records on a real NCCL
group (`_flight_report` says what is checked).

Each rank (one process per GPU, two at most; one process on one GPU) runs `rank_workload`: it
turns collective timing on as the agent does (`flight_recorder.enable_nccl_timing`, what
``TORCH_NCCL_ENABLE_TIMING=1`` does at a group's creation), reads its recorder as the agent does
(`flight_recorder.dump_sources`, `collective_reader.CollectiveReader`), issues known collectives,
compares each native dump with its binding's, and then takes part in a deliberate stall: with two
processes rank 1 sleeps past `core.hangs.BLOCKED_AFTER_S` before one all_reduce while rank 0 waits
in it; with one, the device is kept busy (``torch.cuda._sleep``) so the all_reduce queued behind
the busy kernel stays open. Halfway through the stall every rank reads its recorder and writes
its progress; the parent joins them with `core.hangs.find_hangs`, as a collector would.

`rank_workload` takes the backend and device, so the same code runs on gloo and CPU in the tests
(no durations, no device stall there); everything torch-specific is in the functions that take a
``torch`` module or run in the ranks.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from mfuscope.cli.validate_gpu._flight_report import (
    DumpComparison,
    FlightProbe,
    OpTraffic,
    StallProbe,
)

__all__ = [
    "CALLS",
    "compare_dumps",
    "flight_probe",
    "join_stall",
    "rank_workload",
    "skip_reason",
    "traffic_against",
]

CALLS = 5  # of each op
# The timed all_reduces' size on CUDA (float32: 1 GiB): long enough (about half a millisecond at
# world size 1 on an H100's memory) that the few microseconds between the events around a call
# and the recorder's own inside it stay well within the check's 10 %.
TIMED_NUMEL = 1 << 28
# The stall lasts past the hang join's threshold; the ranks read their recorders after this long.
STALL_MARGIN_S = 2.0
READ_MARGIN_S = 0.5
_BINDINGS = {"generic": "_dump_fr_trace_json", "nccl": "_dump_nccl_trace_json"}


def skip_reason() -> str:
    """Why the probe cannot run here ("" when it can): it needs CUDA and NCCL."""
    try:
        import torch
        import torch.distributed as dist
    except ImportError:
        return "torch is not installed"
    if not (torch.cuda.is_available() and torch.cuda.device_count() > 0):
        return "no CUDA device"
    if not (dist.is_available() and dist.is_nccl_available()):
        return "this torch build has no NCCL"
    return ""


def _first_difference(a: Any, b: Any, path: str = "$") -> str:
    if type(a) is not type(b):
        return f"{path}: {type(a).__name__} vs {type(b).__name__}"
    if isinstance(a, dict):
        for key in sorted(set(a) | set(b), key=str):
            if key not in a or key not in b:
                return f"{path}.{key}: only in the {'binding' if key not in a else 'native'} dump"
            found = _first_difference(a[key], b[key], f"{path}.{key}")
            if found:
                return found
        return ""
    if isinstance(a, list):
        if len(a) != len(b):
            return f"{path}: {len(a)} vs {len(b)} items"
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            found = _first_difference(x, y, f"{path}[{i}]")
            if found:
                return found
        return ""
    return "" if a == b else f"{path}: {a!r} vs {b!r}"


def compare_dumps(source: str, native: bytes, binding: bytes | str) -> DumpComparison:
    """A native JSON dump against the binding's JSON dump of the same recorder."""
    mine, theirs = json.loads(native), json.loads(binding)
    entries = mine.get("entries", []) if isinstance(mine, dict) else []
    difference = _first_difference(mine, theirs)
    return DumpComparison(source, len(entries), not difference, difference)


def traffic_against(
    records: Sequence[Any], issued: Mapping[str, tuple[int, int]]
) -> tuple[OpTraffic, ...]:
    """The agent's traffic records (`CollectiveTraffic`) per issued op: counted against issued
    ``(calls, bytes)``. An op issued and never counted shows zeros."""
    out = []
    for op, (calls, size) in sorted(issued.items()):
        mine = [r for r in records if r.op == op]
        out.append(
            OpTraffic(
                op=op,
                calls=sum(r.calls for r in mine),
                bytes=sum(r.bytes for r in mine),
                seconds=sum(r.seconds for r in mine),
                expected_calls=calls,
                expected_bytes=size,
            )
        )
    return tuple(out)


def join_stall(mode: str, stalled_rank: int, seq: int, statuses: Sequence[Any]) -> StallProbe:
    """The ranks' progress reports (`GroupProgress` tuples, one report per rank, as
    ``(rank, groups)``) joined by `core.hangs.find_hangs`, as a collector joins them."""
    from mfuscope.core.hangs import RankComm, find_hangs

    ranks = [
        RankComm(rank, "localhost", "validate-gpu", tuple(groups), age_s=0.0, interval_s=10.0)
        for rank, groups in statuses
    ]
    view = find_hangs(ranks)
    waits = [g.pending.waited_s for _, gs in statuses for g in gs if g.pending is not None]
    return StallProbe(
        mode=mode,
        stalled_rank=stalled_rank,
        seq=seq,
        suspects=tuple(s.rank for s in view.suspects),
        suspect_seqs=tuple(s.seq for s in view.suspects),
        blocked_ops=tuple(b.op for b in view.blocked),
        waited_s=max(waits, default=0.0),
    )


# --- inside a rank -------------------------------------------------------------------------------


def _names(world: int) -> Callable[[str, str], Any]:
    from mfuscope.core.flight_accounting import GroupName
    from mfuscope.core.vocabulary import TIER_INTRA_NODE, WORLD_AXIS

    name = GroupName(WORLD_AXIS, TIER_INTRA_NODE, world)
    return lambda group, desc: name


def _settle(reader: Any, timeout_s: float = 5.0) -> None:
    """Read until nothing is open (a backend marks an op done a moment after the wait)."""
    deadline = time.monotonic() + timeout_s
    reader.read_once()
    while reader.open_entries and time.monotonic() < deadline:
        time.sleep(0.05)
        reader.read_once()


def _timed_all_reduces(torch: Any, dist: Any, device: str, numel: int) -> float:
    """`CALLS` all_reduces of `numel` float32, each between two CUDA events on the current
    stream; their event times added up (s; 0 on CPU, untimed). On CUDA the op is AVG: at world
    size 1 NCCL runs its one-rank reduction kernel for it (an in-place sum runs no kernel, and
    its duration would be only the recorder's own event pair)."""
    tensor = torch.ones(numel, device=device, dtype=torch.float32)
    if not device.startswith("cuda"):
        for _ in range(CALLS):
            dist.all_reduce(tensor)
        return 0.0
    pairs = [
        (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
        for _ in range(CALLS)
    ]
    torch.cuda.synchronize()
    for start, end in pairs:
        start.record()
        dist.all_reduce(tensor, op=dist.ReduceOp.AVG)
        end.record()
    torch.cuda.synchronize()
    return float(sum(start.elapsed_time(end) for start, end in pairs)) / 1e3


def _issue(
    torch: Any, dist: Any, device: str, world: int, numel: int
) -> tuple[dict[str, tuple[int, int]], float]:
    """`CALLS` each of all_reduce (`TIMED_NUMEL` float32 on CUDA, timed by events), all_gather
    and broadcast (`numel`); the issued calls and bytes (the larger side of each, as the records
    count), and the all_reduces' CUDA-event time (s; 0 on CPU)."""
    reduced = TIMED_NUMEL if device.startswith("cuda") else numel
    events_s = _timed_all_reduces(torch, dist, device, reduced)
    tensor = torch.ones(numel, device=device, dtype=torch.float32)
    gathered = torch.empty(world * numel, device=device, dtype=torch.float32)
    size = tensor.element_size() * numel
    timed = device.startswith("cuda")
    gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    for _ in range(CALLS):
        gather(gathered, tensor)
    for _ in range(CALLS):
        dist.broadcast(tensor, src=0)
    if timed:
        torch.cuda.synchronize()
    issued = {
        "all_reduce": (CALLS, CALLS * 4 * reduced),
        "all_gather": (CALLS, CALLS * world * size),
        "broadcast": (CALLS, CALLS * size),
    }
    return issued, events_s


def _dump_comparisons(sources: Sequence[Any]) -> tuple[DumpComparison, ...]:
    import torch._C._distributed_c10d as c10d

    out = []
    for source in sources:
        binding = getattr(c10d, _BINDINGS.get(source.name, ""), None)
        if source.native and binding is not None:
            out.append(compare_dumps(source.name, source.dump(), binding(True, False)))
    return tuple(out)


def _ring(sources: Sequence[Any]) -> list[Any]:
    """Every entry of the recorders as `FlightEntry`s, read through their bindings (an entry two
    bindings of one ring both return is kept once)."""
    import torch._C._distributed_c10d as c10d
    from mfuscope.core.flight_records import entry_from_dump

    seen: set[tuple[int, int]] = set()
    out = []
    for source in sources:
        binding = getattr(c10d, _BINDINGS.get(source.name, ""), None)
        raw = json.loads(binding(True, False)) if binding is not None else {}
        for item in raw.get("entries", []) if isinstance(raw, dict) else []:
            entry = entry_from_dump(item)
            if entry is not None and (entry.record_id, entry.created_unix_ns) not in seen:
                seen.add((entry.record_id, entry.created_unix_ns))
                out.append(entry)
    return out


def _done_and_timed(entries: Sequence[Any], before: set[tuple[int, int]]) -> tuple[int, int]:
    """Of the collectives not in `before`: how many completed, and how many carry a duration."""
    fresh = [e for e in entries if (e.record_id, e.created_unix_ns) not in before]
    done = [e for e in fresh if e.done and e.op is not None]
    return len(done), sum(e.duration_s is not None for e in done)


def _busy_device(torch: Any, seconds: float) -> None:
    """Keep the current CUDA stream busy for about `seconds` (``torch.cuda._sleep`` spins for a
    number of cycles: calibrated here first)."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    cycles = 50_000_000
    start.record()
    torch.cuda._sleep(cycles)
    end.record()
    end.synchronize()
    per_s = cycles / max(start.elapsed_time(end) / 1e3, 1e-6)
    torch.cuda._sleep(int(per_s * seconds))


def rank_workload(
    rank: int, world: int, *, device: str, stall_s: float, out_dir: Path
) -> dict[str, Any]:
    """Inside an initialised process group: everything one rank measures (written to
    ``out_dir/flight-rank{rank}.json`` too). `stall_s` 0: no stall."""
    import msgspec
    import torch
    import torch.distributed as dist
    from mfuscope.agent import RateLimitedLog
    from mfuscope.agent.collective_reader import CollectiveReader
    from mfuscope.agent.flight_recorder import dump_sources, enable_nccl_timing, ring_entries

    warm = torch.ones(1024, device=device)
    dist.all_reduce(warm)  # the communicator exists before timing is turned on
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    timed_groups = enable_nccl_timing() if device.startswith("cuda") else 0
    sources = dump_sources()
    log = RateLimitedLog(60.0, logger=logging.getLogger("mfuscope.validate"))
    reader = CollectiveReader(
        sources, _names(world), log=log, durations=bool(timed_groups), ring_entries=ring_entries()
    )
    reader.baseline()
    before = {(e.record_id, e.created_unix_ns) for e in _ring(sources)}
    issued, events_s = _issue(torch, dist, device, world, 1 << 18)
    _settle(reader)
    traffic = traffic_against(reader.records().traffic, issued)
    done, timed = _done_and_timed(_ring(sources), before)
    dumps = _dump_comparisons(sources)
    result: dict[str, Any] = {
        "rank": rank,
        "native": any(s.native for s in sources),
        "dumps": [msgspec.to_builtins(d) for d in dumps],
        "done": done,
        "timed": timed,
        "all_reduce_event_s": events_s,
        "traffic": [msgspec.to_builtins(t) for t in traffic],
    }
    if stall_s > 0:
        result["stall"] = _stall(torch, dist, reader, rank, world, device, stall_s)
    (out_dir / f"flight-rank{rank}.json").write_text(json.dumps(result), encoding="utf-8")
    return result


def _stall(
    torch: Any, dist: Any, reader: Any, rank: int, world: int, device: str, stall_s: float
) -> dict[str, Any]:
    """The stall (module docstring); this rank's progress read during it."""
    import msgspec

    tensor = torch.ones(1024, device=device)
    dist.barrier(device_ids=[torch.cuda.current_device()] if device.startswith("cuda") else None)
    _settle(reader)
    read_after = stall_s - STALL_MARGIN_S + READ_MARGIN_S
    if world == 1:
        _busy_device(torch, stall_s)
        dist.all_reduce(tensor)  # queued behind the busy kernel: open until it ends
        time.sleep(read_after)
        reader.read_once()
    elif rank == 1:
        time.sleep(read_after)
        reader.read_once()  # while rank 0 waits: this rank has not entered the all_reduce
        time.sleep(stall_s - read_after)
        dist.all_reduce(tensor)
    else:
        work = dist.all_reduce(tensor, async_op=True)
        time.sleep(read_after)
        reader.read_once()
        work.wait()
    groups = reader.records().groups
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    return {"groups": [msgspec.to_builtins(g) for g in groups]}


def _rank_main(rank: int, world: int, port: int, out_dir: str, stall_s: float) -> None:
    """One process of the probe: GPU `rank` in an NCCL group of `world`."""
    import mfuscope.agent  # noqa: F401  (asks for the flight recorder before the group exists)
    import torch
    import torch.distributed as dist

    torch.cuda.set_device(rank)
    dist.init_process_group(
        "nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world
    )
    try:
        rank_workload(rank, world, device=f"cuda:{rank}", stall_s=stall_s, out_dir=Path(out_dir))
    finally:
        dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    return port


def probe_from_results(world: int, results: Sequence[Mapping[str, Any]]) -> FlightProbe:
    """The probe's findings from the ranks' results (rank 0's own figures; the stall joined
    over every rank's progress)."""
    import msgspec
    from mfuscope.core.collective_records import GroupProgress

    first = min(results, key=lambda r: r["rank"])
    stall = None
    if all("stall" in r for r in results):
        statuses = [
            (r["rank"], msgspec.convert(r["stall"]["groups"], tuple[GroupProgress, ...]))
            for r in results
        ]
        pending = [g.pending.seq for _, gs in statuses for g in gs if g.pending is not None]
        mode = "device" if world == 1 else "peer"
        stall = join_stall(mode, 0 if world == 1 else 1, max(pending, default=-1), statuses)
    return FlightProbe(
        world_size=world,
        native=bool(first["native"]),
        dumps=tuple(DumpComparison(**d) for d in first["dumps"]),
        timed=int(first["timed"]),
        done=int(first["done"]),
        all_reduce_event_s=float(first["all_reduce_event_s"]),
        traffic=tuple(OpTraffic(**t) for t in first["traffic"]),
        stall=stall,
    )


def flight_probe(out_dir: Path, *, gpus: int) -> FlightProbe:
    """The probe over two processes on two GPUs, or one process on one (module docstring)."""
    from mfuscope.core.hangs import BLOCKED_AFTER_S

    reason = skip_reason()
    if reason:
        return FlightProbe(0, False, (), 0, 0, 0.0, (), None, skipped=f"skipped: {reason}")
    world = 2 if gpus >= 2 else 1
    stall_s = BLOCKED_AFTER_S + STALL_MARGIN_S
    port = _free_port()
    for stale in out_dir.glob("flight-rank*.json"):
        os.remove(stale)
    if world == 1:
        _rank_main(0, 1, port, str(out_dir), stall_s)
    else:
        import torch.multiprocessing as mp

        mp.spawn(_rank_main, args=(world, port, str(out_dir), stall_s), nprocs=world)
    results = [
        json.loads((out_dir / f"flight-rank{rank}.json").read_text(encoding="utf-8"))
        for rank in range(world)
    ]
    return probe_from_results(world, results)
