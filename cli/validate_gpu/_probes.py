"""The GPU-touching probes of `mfuscope validate-gpu`: each one small, each returning plain data
for `_report`. They import torch (and NVML) when called; nothing here runs without a CUDA device.
"""

from __future__ import annotations

import json
import logging
import statistics
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mfuscope.cli.validate_gpu._report import (
    CollectiveSeen,
    CounterProbe,
    Detection,
    MatmulProbe,
    NcclProbe,
    TrainingProbe,
    WindowProbe,
)

__all__ = [
    "FULL_MODEL",
    "QUICK_MODEL",
    "ModelSize",
    "TrainingSetup",
    "counters",
    "detect",
    "matmul_rate",
    "nccl_collectives",
    "nvml_view",
    "profiled_window",
    "training",
]

if TYPE_CHECKING:
    from mfuscope.agent.gpu_identity import GpuRef

_BUCKETS = ("compute_s", "recompute_s", "exposed_comm_s", "other_s", "bubble_s")


def detect() -> Detection:
    """The current CUDA device's name from torch and from NVML (the NVML device found by the
    CUDA device's UUID / PCI bus id, never by its CUDA index: docs/agent.md#gpu-identity), and
    its dense bf16 peak from the hardware table (a slice's share when NVML says MIG is on)."""
    import torch
    from mfuscope.agent.gpu_identity import cuda_gpu_ref
    from mfuscope.core.hardware import resolve_peak

    index = torch.cuda.current_device()
    name = torch.cuda.get_device_name(index)
    nvml_name, mig = nvml_view(cuda_gpu_ref(index))
    lookup = resolve_peak(name, "bf16", mig=mig)
    return Detection(
        torch_name=name,
        nvml_name=nvml_name,
        peak_flops=lookup.peak_flops,
        peak_source=lookup.source,
        peak_message=lookup.message,
        gpu_count=torch.cuda.device_count(),
    )


def nvml_view(gpu: GpuRef, nvml: Any = None) -> tuple[str, bool]:
    """NVML's name of `gpu` (or why it is unavailable) and whether it runs in MIG mode, by the
    agent's own join of a CUDA device to its NVML device (`gpu_identity.match_gpu`). `nvml`:
    an object with pynvml's functions (default: ``pynvml``)."""
    from mfuscope.agent.detect import detect_hardware
    from mfuscope.agent.gpu_identity import match_gpu, runs_in_mig_mode

    facts = detect_hardware(nvml=nvml)
    found = match_gpu(facts.gpus, gpu)
    mig = runs_in_mig_mode(facts.gpus, gpu)
    if found is not None and found.name:
        return found.name, mig
    if facts.gpus:
        why = f"no NVML GPU matches CUDA device {gpu.cuda_index} by UUID or PCI bus id"
    else:  # NVML's own reason (no library, no driver, no GPU), not the NIC lines
        why = next((r for r in facts.reasons if "NVML" in r), "NVML found no GPU")
    return f"unavailable ({why})", mig


def matmul_rate(size: int, repeats: int) -> MatmulProbe:
    """Dense bf16 ``size x size`` GEMMs back to back, timed with CUDA events: 2 n^3 FLOPs each."""
    import torch

    a = torch.randn(size, size, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(size, size, device="cuda", dtype=torch.bfloat16)
    out = torch.empty_like(a)
    for _ in range(3):
        torch.mm(a, b, out=out)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    for _ in range(repeats):
        torch.mm(a, b, out=out)
    end.record()
    end.synchronize()
    seconds = start.elapsed_time(end) / 1e3
    return MatmulProbe(size=size, flops_per_s=2.0 * size**3 * repeats / seconds)


@dataclass(frozen=True)
class ModelSize:
    layers: int
    width: int
    seq: int
    batch: int
    vocab: int = 8192


FULL_MODEL = ModelSize(layers=8, width=1024, seq=1024, batch=8)
QUICK_MODEL = ModelSize(layers=4, width=512, seq=512, batch=8)


class TrainingSetup:
    """A bf16 GPT (`mfuscope.cli.demo.job.tiny_gpt`) with one fixed batch on `device`, plain SGD
    (no host synchronisation in the optimizer step), and its analytical FLOPs per step."""

    def __init__(self, size: ModelSize, device: str = "cuda") -> None:
        import torch
        from mfuscope.cli.demo.job.tiny_gpt import GPTConfig, GPTStage, MarkovTokens
        from mfuscope.core.flops import TransformerShape, transformer_flops_per_token

        heads = max(size.width // 64, 1)
        self.device = device
        self.config = GPTConfig(
            vocab_size=size.vocab,
            seq_len=size.seq,
            d_model=size.width,
            n_heads=heads,
            n_layers=size.layers,
            checkpoint_every=0,
        )
        self.model = GPTStage(self.config).to(device)
        inputs, targets = MarkovTokens(self.config).batch(0, 0, size.batch)
        self.inputs, self.targets = inputs.to(device), targets.to(device)
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=1e-4)
        shape = TransformerShape(
            layers=size.layers, hidden=size.width, heads=heads, vocab=size.vocab
        )
        per_token = transformer_flops_per_token(shape, seq_len=size.seq, convention="megatron")
        # Counted model FLOPs leave out the attention backward's score recompute (it is counted
        # as recompute, docs/definitions.md#which-flops-are-which): the formula, exactly.
        self.analytical_flops = per_token.model * size.batch * size.seq

    def synchronize(self) -> None:
        import torch

        if self.device == "cuda":
            torch.cuda.synchronize()

    def step(self) -> None:
        import torch

        with torch.autocast(self.device, dtype=torch.bfloat16):
            loss = self.model(self.inputs, self.targets)
        loss.backward()
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)


def _block_seconds(
    setup: TrainingSetup, scope: Callable[[], AbstractContextManager[Any]], steps: int
) -> float:
    """Synchronised wall time per step over `steps` steps, each inside `scope()`."""
    setup.synchronize()
    start = time.perf_counter()
    for _ in range(steps):
        with scope():
            setup.step()
    setup.synchronize()
    return (time.perf_counter() - start) / steps


@contextmanager
def _sync_debug_error(device: str) -> Iterator[None]:
    """Any host synchronisation raises inside (CUDA only: a CPU step has nothing to wait for)."""
    import torch

    if device != "cuda":
        yield
        return
    torch.cuda.set_sync_debug_mode("error")
    try:
        yield
    finally:
        torch.cuda.set_sync_debug_mode("default")


def training(setup: TrainingSetup, out_dir: Path, *, rounds: int, block: int) -> TrainingProbe:
    """The loop under the agent: warm-up (and the FLOP-counting step), ordinary steps under sync
    debug mode, then `rounds` interleaved blocks of `block` steps with and without the agent."""
    from mfuscope.agent import Agent
    from mfuscope.core.mfu import hfu, mfu
    from mfuscope.core.schema import decode_batch

    jsonl = out_dir / "agent-rank{rank}.jsonl"
    jsonl.parent.mkdir(parents=True, exist_ok=True)
    agent = Agent(
        job="validate-gpu",
        jsonl_path=str(jsonl),
        model=setup.model,
        dtype="bf16",
        profile=False,
        flush_interval_s=1.0,
    )
    for _ in range(5):
        with agent.step():
            setup.step()
    sync_error: str | None = None
    errors_before = agent.health.internal_errors
    try:
        with _sync_debug_error(setup.device):
            for _ in range(10):
                with agent.step():
                    setup.step()
    except RuntimeError as exc:
        sync_error = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    on: list[float] = []
    off: list[float] = []
    for _ in range(rounds):
        on.append(_block_seconds(setup, agent.step, block))
        off.append(_block_seconds(setup, nullcontext, block))
    internal_errors = agent.health.internal_errors - errors_before
    agent.close()
    path = Path(str(jsonl).replace("{rank}", "0"))
    reports = [r for line in path.read_text().splitlines() for r in decode_batch(line).reports]
    peak = decode_batch(path.read_text().splitlines()[-1]).peak_flops
    ordinary = [r for r in reports if r.step >= 5]  # after warm-up and the counting step
    median = sorted(ordinary, key=lambda r: r.wall_s)[len(ordinary) // 2]
    return TrainingProbe(
        steps=len(reports),
        event_step_s=statistics.median(r.wall_s for r in ordinary),
        wall_step_s=statistics.median(on),
        counted_model_flops=median.model_flops,
        analytical_model_flops=setup.analytical_flops,
        mfu=None if peak is None else mfu(median.model_flops, peak, median.wall_s),
        hfu=None
        if peak is None
        else hfu(median.model_flops, median.recompute_flops, peak, median.wall_s),
        overhead_ratio=statistics.median(on) / statistics.median(off),
        sync_error=sync_error,
        agent_internal_errors=internal_errors,
    )


def _profile(
    work: Callable[[], None], steps: int, trace_path: Path, *, device: str = "cuda"
) -> None:
    """Run `work` `steps` times under torch.profiler, each inside ``ProfilerStep#i``."""
    import torch
    from torch.profiler import ProfilerActivity, profile, record_function

    activities = [ProfilerActivity.CPU]
    if device == "cuda":
        activities.append(ProfilerActivity.CUDA)
    with profile(activities=activities, record_shapes=True) as p:
        for i in range(steps):
            with record_function(f"ProfilerStep#{i}"):
                work()
        if device == "cuda":
            torch.cuda.synchronize()
    p.export_chrome_trace(str(trace_path))


def _kernel_names(trace_path: Path) -> list[str]:
    """The name of every device kernel in a Chrome trace (one entry per launch)."""
    events = json.loads(trace_path.read_text()).get("traceEvents", [])
    return [str(e.get("name")) for e in events if e.get("cat") == "kernel"]


def profiled_window(setup: TrainingSetup, out_dir: Path) -> WindowProbe:
    """Three profiled steps; the middle one decomposed from the real CUDA trace."""
    from mfuscope.core.trace import analyze_trace, read_trace

    trace_path = out_dir / "window-trace.json"
    _profile(setup.step, 3, trace_path, device=setup.device)
    steps = analyze_trace(read_trace(trace_path)).steps
    step = steps[len(steps) // 2]
    return WindowProbe(
        wall_s=step.wall_s,
        buckets={name.removesuffix("_s"): getattr(step, name) for name in _BUCKETS},
        kernels=len(_kernel_names(trace_path)),
    )


def _nccl_rank(rank: int, world: int, port: int, megabytes: int, trace_path: str) -> None:
    """One rank of the NCCL probe (a process of its own): GPU `rank`, all_reduce, rank 0 traced."""
    import torch
    import torch.distributed as dist

    torch.cuda.set_device(rank)
    dist.init_process_group(
        "nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world
    )
    try:
        tensor = torch.ones(megabytes * (1 << 20) // 4, device="cuda", dtype=torch.float32)
        for _ in range(3):
            dist.all_reduce(tensor)

        def work() -> None:
            for _ in range(4):
                dist.all_reduce(tensor)

        if rank == 0:
            _profile(work, 2, Path(trace_path))
        else:
            for _ in range(2):
                work()
            torch.cuda.synchronize()
    finally:
        dist.destroy_process_group()


def nccl_collectives(out_dir: Path, *, megabytes: int, gpus: int) -> NcclProbe:
    """An NCCL group over up to 8 of the `gpus` GPUs (one process each; one rank in this process
    on a single GPU): all_reduce of `megabytes` MiB, rank 0 profiled and decomposed.

    With one rank the nccl-tests bus factor 2(n-1)/n is 0, so busbw is 0 by definition: that run
    proves that the kernels are recognised with size and op, not the fabric's speed. NCCL may run
    a one-rank in-place all_reduce without a kernel at all; `kernel_names` then says so.
    """
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    world = min(max(gpus, 1), 8)
    trace_path = out_dir / "nccl-trace.json"
    if world == 1:
        _nccl_rank(0, 1, port, megabytes, str(trace_path))
    else:
        import torch.multiprocessing as mp

        mp.spawn(_nccl_rank, args=(world, port, megabytes, str(trace_path)), nprocs=world)

    from mfuscope.core.trace import analyze_trace, read_trace

    steps = analyze_trace(read_trace(trace_path)).steps
    seen = tuple(
        CollectiveSeen(c.op, c.bytes, c.seconds, c.busbw_bytes_per_s)
        for step in steps
        for c in step.collectives
    )
    return NcclProbe(
        world_size=world,
        expected_bytes=megabytes * (1 << 20),
        collectives=seen,
        kernel_names=tuple(sorted(set(_kernel_names(trace_path))))[:12],
    )


def _pcie(record: Any, direction: str) -> int | None:
    if record is None:
        return None
    return next(
        (x.bytes_total for x in record.links if x.link == "pcie" and x.direction == direction), None
    )


def _delta(after: int | None, before: int | None) -> int | None:
    return None if after is None or before is None else after - before


def counters(*, seconds: float, gigabytes: int) -> CounterProbe:
    """The agent's hardware-counter sampler on the current GPU: memory busy idle and during
    `seconds` of device-to-device copies, and PCIe bytes around `gigabytes` GiB copied host ->
    device."""
    import torch
    from mfuscope.agent import RateLimitedLog
    from mfuscope.agent.gpu_identity import cuda_gpu_ref
    from mfuscope.agent.hwcounters import build_hardware_sampler

    log = RateLimitedLog(60.0, logger=logging.getLogger("mfuscope.validate"))
    gpu = cuda_gpu_ref(torch.cuda.current_device())
    # Sampled here, between the probe's own steps (NVML's utilisation covers the time since the
    # previous sample), rather than on a thread of the sampler's own.
    sampler = build_hardware_sampler(gpu=gpu, sample_nics=False, log=log, interval_s=0.1)
    try:
        sampler.sample()
        time.sleep(1.5)
        sampler.sample()
        idle = sampler.snapshot()
        size = 1 << 30
        source = torch.empty(size, dtype=torch.uint8, device="cuda")
        target = torch.empty_like(source)
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            for _ in range(20):
                target.copy_(source)
            torch.cuda.synchronize()
            sampler.sample()
        busy = sampler.snapshot()
        del source, target
        host = torch.empty(size, dtype=torch.uint8).pin_memory()
        device = torch.empty(size, dtype=torch.uint8, device="cuda")
        sampler.sample()
        before = sampler.snapshot()
        for _ in range(gigabytes):
            device.copy_(host, non_blocking=True)
        torch.cuda.synchronize()
        time.sleep(0.3)  # let the counters settle past the copy
        sampler.sample()
        after = sampler.snapshot()
    finally:
        sampler.stop()
    return CounterProbe(
        memory_busy_idle=None if idle is None else idle.memory_busy_ratio,
        memory_busy_under_copy=None if busy is None else busy.memory_busy_ratio,
        h2d_bytes=gigabytes * size,
        pcie_rx_bytes=_delta(_pcie(after, "rx"), _pcie(before, "rx")),
        pcie_tx_bytes=_delta(_pcie(after, "tx"), _pcie(before, "tx")),
        sm_clock_ratio=None if busy is None else busy.sm_clock_ratio,
        power_watts=None if busy is None else busy.power_watts,
    )
