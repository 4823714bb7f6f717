"""validate-gpu's probes of the agent against the job's own CUDA-event timing (`_agent_report`
says what each checks): one process, one GPU, NCCL at world size 1.

- `mfu_truth`: `with agent.step():` around a chain of bf16 GEMMs of known FLOPs (2 n^3 each);
  a CUDA event recorded right after the agent's own at each step start times the steps.
- `breakdown_truth`: `agent.mark_step()` at the top of steps of a known shape: GEMMs, a host
  sleep after waiting for them (the device idles), GEMMs, an all_reduce on a world-size-1 NCCL
  group (``ReduceOp.AVG``: NCCL runs its one-rank reduction kernel; an in-place sum runs none),
  each part between CUDA events. A profiled window is taken early; steps go on until its
  analysis is in and then as many again, so that the agent carries its breakdown. The events
  give each step's compute, communication and idle; the agent's reports (its window's steps
  and the steps it carried, by whatever rule it carries them) give its own.
- `hot_path_cost`: the contract tests' probe (`mfuscope.agent.hot_path_probe`) on the device:
  the training thread's time per step inside `with agent.step():` and `agent.mark_step()`
  against `Floor` and `DeviceFloor`, and what a steady boundary runs.

Everything that touches the device goes through `Gpu` (`CudaGpu` here; the tests pass a
simulated device) and the agents through `agent_factory` (`Agent`; the tests build agents over
the simulated device's CUDA calls and window analysis).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from mfuscope.cli.validate_gpu._agent_report import BreakdownProbe, CostProbe, MfuProbe, Shares

__all__ = [
    "CudaGpu",
    "Gpu",
    "breakdown_truth",
    "hot_path_cost",
    "mfu_truth",
]

AgentFactory = Callable[..., Any]  # Agent(**options)
WARM_STEPS = 3  # the first step counts FLOPs; the next settle
WINDOW_FIRST_STEP = 5
WINDOW_STEPS = 3
MAX_BREAKDOWN_STEPS = 5000
ANALYSIS_WAIT_S = 60.0
SETTLE_S = 0.3  # three of the periodic thread's longest pauses between two reads
LISTING_TRIES = 3


class Gpu(Protocol):
    """The device as the agent probes use it. `calls`: the CUDA calls of a step boundary (the
    device floor's); `start_calls` / `end_calls`: what the device part of a step start / end
    shows to `sys.setprofile` (`opaque`: a source file whose calls it does not list)."""

    calls: Any
    start_calls: tuple[tuple[str, str], ...]
    end_calls: tuple[tuple[str, str], ...]
    opaque: str | None

    def gemm_flops(self) -> float: ...  # FLOPs of one GEMM of `gemms`

    def gemms(self, count: int) -> None: ...  # `count` GEMMs back to back

    def tiny(self) -> None: ...  # a step of almost no device work (the cost probe's)

    def all_reduce(self) -> None: ...

    def event(self) -> Any: ...

    def record(self, event: Any) -> None: ...  # on the current stream

    def elapsed_s(self, start: Any, end: Any) -> float: ...

    def wait(self, event: Any) -> None: ...  # the host waits until the device passed it

    def sleep(self, seconds: float) -> None: ...  # the host sleeps

    def synchronize(self) -> None: ...


class CudaGpu:
    """`Gpu` on the current CUDA device: bf16 GEMMs of `size`, and (`comm_bytes` > 0) an AVG
    all_reduce of that many bytes on a world-size-1 NCCL group made here unless one exists
    (`close()` destroys what it made)."""

    start_calls = (("c_call", "pop"), ("c_call", "record"))  # the stream handle: a C partial
    end_calls = (("c_call", "record"),)
    opaque = None

    def __init__(self, *, size: int, comm_bytes: int = 0) -> None:
        import mfuscope.agent  # noqa: F401  (asks for the flight recorder before the group)
        import torch
        import torch.distributed as dist
        from mfuscope.agent.step_timer import cuda_calls

        self._torch, self._dist = torch, dist
        index = torch.cuda.current_device()
        self.calls = cuda_calls(index)
        self.size = size
        self._a = torch.randn(size, size, device="cuda", dtype=torch.bfloat16)
        self._b = torch.randn(size, size, device="cuda", dtype=torch.bfloat16)
        self._out = torch.empty_like(self._a)
        self._small = torch.randn(64, 64, device="cuda")
        self._own_group = False
        self._buffer: Any = None
        if comm_bytes > 0:
            if not dist.is_initialized():
                dist.init_process_group(
                    "nccl",
                    store=dist.HashStore(),
                    rank=0,
                    world_size=1,
                    device_id=torch.device("cuda", index),
                )
                self._own_group = True
            self._buffer = torch.ones(comm_bytes // 4, device="cuda", dtype=torch.float32)
        torch.cuda.synchronize()

    def gemm_flops(self) -> float:
        return 2.0 * self.size**3

    def gemms(self, count: int) -> None:
        for _ in range(count):
            self._torch.mm(self._a, self._b, out=self._out)

    def tiny(self) -> None:
        self._small.add_(1.0)

    def all_reduce(self) -> None:
        self._dist.all_reduce(self._buffer, op=self._dist.ReduceOp.AVG)

    def event(self) -> Any:
        return self._torch.cuda.Event(enable_timing=True)

    def record(self, event: Any) -> None:
        event.record()

    def elapsed_s(self, start: Any, end: Any) -> float:
        return float(start.elapsed_time(end)) / 1e3

    def wait(self, event: Any) -> None:
        event.synchronize()

    def sleep(self, seconds: float) -> None:
        time.sleep(seconds)

    def synchronize(self) -> None:
        self._torch.cuda.synchronize()

    def close(self) -> None:
        if self._own_group:
            self._dist.destroy_process_group()
            self._own_group = False


def _reports(path: Path) -> dict[int, Any]:
    from mfuscope.core.schema import decode_batch

    lines = path.read_text(encoding="utf-8").splitlines() if path.exists() else []
    return {r.step: r for line in lines for r in decode_batch(line).reports}


def _options(out_dir: Path, name: str, peak_flops: float, **more: Any) -> dict[str, Any]:
    return {
        "job": f"validate-gpu-{name}",
        "jsonl_path": str(out_dir / f"agent-{name}.jsonl"),
        "peak_flops": peak_flops,
        "dtype": "bf16",
        "flush_interval_s": 1.0,
        **more,
    }


def mfu_truth(
    gpu: Gpu, agent_factory: AgentFactory, out_dir: Path, *, steps: int, chain: int, peak: float
) -> MfuProbe:
    """`steps` steps of `chain` GEMMs under `with agent.step():` (FLOPs counted by the agent),
    against the events (module docstring). `peak`: the peak both MFUs divide by (FLOP/s)."""
    from mfuscope.core.mfu import mfu

    agent = agent_factory(**_options(out_dir, "mfu", peak, profile=False))
    starts = [gpu.event() for _ in range(steps + 1)]
    for k in range(steps):
        with agent.step():
            gpu.record(starts[k])
            gpu.gemms(chain)
    gpu.record(starts[steps])  # the last step's end, right after the agent's
    gpu.synchronize()
    agent.close()
    reports = _reports(out_dir / "agent-mfu.jsonl")
    known = gpu.gemm_flops() * chain
    compared = [k for k in range(WARM_STEPS, steps) if k in reports]
    truth = [mfu(known, peak, gpu.elapsed_s(starts[k], starts[k + 1])) for k in compared]
    mine = [mfu(reports[k].model_flops, peak, reports[k].wall_s) for k in compared]
    counted = statistics.median(reports[k].model_flops for k in compared) if compared else 0.0
    return MfuProbe(
        steps=len(compared),
        known_flops=known,
        counted_flops=counted,
        peak_flops=peak,
        truth_mfu=statistics.median(truth) if truth else 0.0,
        agent_mfu=statistics.median(mine) if mine else 0.0,
    )


def _report_shares(report: Any) -> Shares:
    """A report's buckets as `Shares` (the profiler's own cost on a window step is idle device
    time: `instrumentation`)."""
    seconds: dict[str, float] = {}
    for part in report.components:
        seconds[part.component] = seconds.get(part.component, 0.0) + part.seconds
    wall = report.wall_s
    idle = sum(seconds.get(c, 0.0) for c in ("bubble_idle", "bubble_pipeline", "instrumentation"))
    return Shares(
        (seconds.get("compute", 0.0) + seconds.get("recompute", 0.0)) / wall,
        seconds.get("exposed_comm", 0.0) / wall,
        idle / wall,
    )


def _median_shares(shares: list[Shares]) -> Shares | None:
    if not shares:
        return None
    return Shares(
        statistics.median(s.compute for s in shares),
        statistics.median(s.exposed_comm for s in shares),
        statistics.median(s.idle for s in shares),
    )


def breakdown_truth(
    gpu: Gpu,
    agent_factory: AgentFactory,
    out_dir: Path,
    *,
    gemms: int,
    gap_s: float,
    carried_steps: int,
    peak: float,
    clock: Callable[[], float] = time.monotonic,
) -> BreakdownProbe:
    """Steps of the known shape under `agent.mark_step()` (module docstring): `gemms` GEMMs
    before and after a `gap_s` host sleep, then the all_reduce; `carried_steps` steps after the
    window's analysis came in."""
    agent = agent_factory(
        **_options(
            out_dir,
            "breakdown",
            peak,
            profile=True,
            profile_first_step=WINDOW_FIRST_STEP,
            profile_steps=WINDOW_STEPS,
            profile_every_steps=10**9,
            profile_every_s=1e9,
        )
    )
    marks: list[list[Any]] = []  # per step: start, compute A done, idle done, B done, comm done
    analysed_at: int | None = None
    deadline = clock() + ANALYSIS_WAIT_S
    while len(marks) < MAX_BREAKDOWN_STEPS:
        agent.mark_step()
        events = [gpu.event() for _ in range(5)]
        gpu.record(events[0])
        gpu.gemms(gemms)
        gpu.record(events[1])
        gpu.wait(events[1])
        gpu.sleep(gap_s)
        gpu.record(events[2])
        gpu.gemms(gemms)
        gpu.record(events[3])
        gpu.all_reduce()
        gpu.record(events[4])
        marks.append(events)
        if analysed_at is None:
            health = agent.health.snapshot()
            if health.windows_analysed_total > 0:
                analysed_at = len(marks)
            elif health.profiler_failures_total > 0 or clock() > deadline:
                break  # no window to compare: the check says so
        elif len(marks) >= analysed_at + carried_steps:
            break
    end = gpu.event()
    gpu.record(end)
    gpu.synchronize()
    agent.close()
    reports = _reports(out_dir / "agent-breakdown.jsonl")
    truth: dict[int, Shares] = {}
    for k in range(len(marks) - 1):  # the last step ends at close, after `end`
        e = marks[k]
        wall = gpu.elapsed_s(e[0], marks[k + 1][0])
        compute = gpu.elapsed_s(e[0], e[1]) + gpu.elapsed_s(e[2], e[3])
        comm = gpu.elapsed_s(e[3], e[4])
        truth[k] = Shares(compute / wall, comm / wall, (wall - compute - comm) / wall)
    window: list[tuple[Shares, Shares]] = []
    carried: list[tuple[Shares, Shares]] = []
    for k, expected in truth.items():
        report = reports.get(k)
        if report is None or not report.components:
            continue
        own = report.breakdown_step == k
        (window if own else carried).append((_report_shares(report), expected))
    return BreakdownProbe(
        truth=_median_shares(list(truth.values())) or Shares(0.0, 0.0, 0.0),
        window=_median_shares([mine for mine, _ in window]),
        carried=_median_shares([mine for mine, _ in carried]),
        window_steps=len(window),
        carried_steps=len(carried),
        window_error=max((m.error(t) for m, t in window), default=0.0),
        carried_error=max((m.error(t) for m, t in carried), default=0.0),
    )


def hot_path_cost(
    gpu: Gpu,
    agent_factory: AgentFactory,
    out_dir: Path,
    *,
    rounds: int,
    block: int,
    settle_s: float = SETTLE_S,
) -> CostProbe:
    """The agents' cost per step on the device path (module docstring): two always-on agents
    (profiling off, FLOPs given), `rounds` rounds of `block` steps per mode, then one steady
    boundary of each kind profiled. Before each profiled boundary the device is synchronised
    and the host sleeps `settle_s`, so that the periodic thread has handed the spent events
    back (a step that finds the pool empty makes a new event: not the steady path); a listing
    that still found it empty is taken again, `LISTING_TRIES` times at most."""
    from mfuscope.agent.hot_path_probe import (
        BoundaryCalls,
        DeviceFloor,
        Floor,
        boundary_calls,
        boundary_costs,
    )

    options = {"profile": False, "flops_per_step": 1.0}
    step_agent = agent_factory(**_options(out_dir, "cost-step", 1e15, **options))
    mark_agent = agent_factory(**_options(out_dir, "cost-mark", 1e15, **options))
    costs = boundary_costs(
        gpu.tiny,
        step_agent=step_agent,
        mark_agent=mark_agent,
        rounds=rounds,
        block=block,
        floors={"floor": Floor(), "device floor": DeviceFloor(gpu.calls)},
    )
    clock = (("c_call", "perf_counter_ns"),)
    expected = BoundaryCalls(
        (("call", "step"), ("call", "__enter__"), *clock, *gpu.start_calls),
        (("call", "__exit__"), *clock, *gpu.end_calls),
        (("call", "mark_step"), ("call", "mark"), *clock, *gpu.start_calls),
    )

    def settle() -> None:
        gpu.synchronize()
        time.sleep(settle_s)

    for _ in range(LISTING_TRIES):
        seen = boundary_calls(step_agent, gpu.tiny, opaque=gpu.opaque, settle=settle)
        if seen == expected:
            break
    gpu.synchronize()
    step_agent.close()
    mark_agent.close()
    unexpected = "; ".join(
        f"{name}: {_listed(getattr(seen, name))}"
        for name in ("entering", "leaving", "marking")
        if getattr(seen, name) != getattr(expected, name)
    )
    return CostProbe(
        steps=len(costs.of("floor")),
        floor_s=costs.median_s("floor"),
        device_floor_s=costs.median_s("device floor"),
        step_median_s=costs.median_s("step"),
        step_p99_s=costs.p99_s("step"),
        mark_median_s=costs.median_s("mark"),
        mark_p99_s=costs.p99_s("mark"),
        calls="; ".join(
            f"{name}: {_listed(getattr(seen, name))}" for name in ("entering", "leaving", "marking")
        ),
        unexpected=unexpected,
    )


def _listed(calls: tuple[tuple[str, str], ...]) -> str:
    return ", ".join(name for _, name in calls)
