"""A simulated GPU for validate-gpu's agent probes (`cli/validate_gpu/_agent_probes.py`) on CPU.

One in-order stream on a simulated clock: a kernel starts when the device is free and the host
has launched it (`max(host, free)`), an event completes when the device reaches it, and the
host's clock moves only when it sleeps or waits for the device. The probes' GEMMs also run as
tiny CPU matmuls (so the agent's FLOP counter counts 2 n^3 each), their all_reduce is a
communication kernel of `comm_s`. `agent_factory()` builds agents whose step timer records on
this device (`DeviceCalls`) and whose profiled windows are decomposed from the kernels the device
ran in each window step (standing in for torch.profiler and the engine): compute, exposed
communication, idle. `misread_comm` makes that decomposition call the communication compute,
so a probe's check can be seen to fail.

Window steps are told apart by the agent's own start events: an agent that only uses
`mark_step()` records one event per step start (and one at close), which is how the breakdown
probe drives it.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from mfuscope.agent._agent import Seams, agent_with_seams
from mfuscope.agent.step_timer import DeviceCalls, DeviceEventStepTimer

from tests.support.agent_fakes import EMPTY_TRACE, Decomposition, Exposed

__all__ = ["SimEvent", "SimulatedGpu"]

SIZE = 8  # the CPU matmuls' n


class SimEvent:
    """A timing event on the simulated device (what the agent's timer and the probes read)."""

    def __init__(self, gpu: SimulatedGpu) -> None:
        self.gpu = gpu
        self.time_s: float | None = None

    def query(self) -> bool:
        return self.time_s is not None and self.time_s <= self.gpu.host_s

    def elapsed_time(self, end_event: SimEvent) -> float:
        assert self.query() and end_event.query(), "elapsed_time before the device passed"
        assert self.time_s is not None and end_event.time_s is not None
        return (end_event.time_s - self.time_s) * 1e3


class _Stream:
    pass


class _AgentDevice:
    """One agent's view of the device: its CUDA calls, its profiler and its window analysis."""

    def __init__(self, gpu: SimulatedGpu) -> None:
        self.gpu = gpu
        self.end: SimEvent | None = None  # the recorder makes its end event first
        self.starts: list[float] = []  # device time of each step start (the agent's events)
        self.window: tuple[int, int, float] | None = None  # first step, last step, stop time
        self._first = 0

    def new_event(self) -> SimEvent:
        event = SimEvent(self.gpu)
        if self.end is None:
            self.end = event
        return event

    def record(self, event: SimEvent, stream: Any) -> None:
        self.gpu.record(event)
        if event is not self.end:
            assert event.time_s is not None
            self.starts.append(event.time_s)

    def raw_stream(self) -> int:
        return 0

    def stream(self) -> _Stream:
        return _Stream()

    def calls(self) -> DeviceCalls:
        return DeviceCalls(self.new_event, self.record, self.raw_stream, self.stream)

    # torch.profiler's part (the agent starts it after the window's first step began)
    def start(self) -> None:
        self._first = len(self.starts) - 1

    def stop(self) -> None:
        self.window = (self._first, len(self.starts) - 1, self.gpu.now_s())

    def export_chrome_trace(self, path: str) -> None:
        Path(path).write_text(EMPTY_TRACE)

    def analyse(self, path: str) -> list[Decomposition]:
        """The window's steps decomposed from the kernels the device ran in each."""
        assert self.window is not None
        first, last, stop_s = self.window
        out = []
        for k in range(first, last + 1):
            start = self.starts[k]
            end = self.starts[k + 1] if k < last else stop_s
            compute, comm = self.gpu.busy(start, end)
            if self.gpu.misread_comm:
                compute, comm = compute + comm, 0.0
            out.append(
                Decomposition(
                    step=k,
                    wall_s=end - start,
                    compute_s=compute,
                    exposed_comm_s=comm,
                    bubble_idle_s=end - start - compute - comm,
                    exposed_comm=(Exposed("world", "intra_node", comm),) if comm else (),
                )
            )
        return out


class SimulatedGpu:
    """`_agent_probes.Gpu` on a simulated device (module docstring)."""

    start_calls = (("c_call", "pop"), ("call", "raw_stream"), ("call", "record"))
    end_calls = (("call", "record"),)
    opaque = __file__

    def __init__(self, *, gemm_s: float, comm_s: float, misread_comm: bool = False) -> None:
        self.gemm_s, self.comm_s, self.misread_comm = gemm_s, comm_s, misread_comm
        self.host_s = 0.0
        self.free_s = 0.0
        self.kernels: list[tuple[float, float, str]] = []
        self.calls = _AgentDevice(self).calls()  # the device floor's
        self._a, self._b = torch.randn(SIZE, SIZE), torch.randn(SIZE, SIZE)
        self._out = torch.empty(SIZE, SIZE)

    def now_s(self) -> float:
        """Where an event recorded now would complete."""
        return max(self.host_s, self.free_s)

    def _launch(self, seconds: float, kind: str) -> None:
        start = self.now_s()
        self.free_s = start + seconds
        self.kernels.append((start, self.free_s, kind))

    def busy(self, start: float, end: float) -> tuple[float, float]:
        """Compute and communication seconds the device ran in [start, end)."""
        spent = {"compute": 0.0, "comm": 0.0}
        for a, b, kind in self.kernels:
            spent[kind] += max(0.0, min(b, end) - max(a, start))
        return spent["compute"], spent["comm"]

    def agent_factory(
        self, change: Callable[[DeviceCalls], DeviceCalls] = lambda calls: calls
    ) -> Any:
        """Builds agents whose step timer and profiled windows are this device's (`change`:
        what the agent gets instead of the device's calls)."""

        def build(**options: Any) -> Any:
            device = _AgentDevice(self)
            timer = DeviceEventStepTimer(
                change(device.calls()), max_pending=1 << 20, close_wait_s=0.0
            )
            seams = Seams(timer=timer, profiler_factory=lambda: device, analyse=device.analyse)
            return agent_with_seams(seams, **options)

        return build

    # --- the probes' device ---------------------------------------------------------------------

    def gemm_flops(self) -> float:
        return 2.0 * SIZE**3

    def gemms(self, count: int) -> None:
        for _ in range(count):
            torch.mm(self._a, self._b, out=self._out)
            self._launch(self.gemm_s, "compute")

    def tiny(self) -> None:
        self._launch(1e-6, "compute")

    def all_reduce(self) -> None:
        self._launch(self.comm_s, "comm")

    def event(self) -> SimEvent:
        return SimEvent(self)

    def record(self, event: SimEvent) -> None:
        event.time_s = self.free_s = self.now_s()

    def elapsed_s(self, start: SimEvent, end: SimEvent) -> float:
        return start.elapsed_time(end) / 1e3

    def wait(self, event: SimEvent) -> None:
        assert event.time_s is not None
        self.host_s = max(self.host_s, event.time_s)

    def sleep(self, seconds: float) -> None:
        self.host_s += seconds

    def synchronize(self) -> None:
        self.host_s = self.now_s()
