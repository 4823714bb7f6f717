"""The agent's own report path, driven by the GPU step model (`gpu_step_model`) in model time.

What runs is the shipped code: the agent's `StepReporter` (the periodic thread's drain) with its
`ReportAssembler`, the `CollectiveReader` reading a flight recorder that holds the model's NCCL
entries as a real one would at each read, and the window analysis the agent runs (`_runtime`'s
engine call on a trace file) on the model's trace of each profiled window. What stands in for
the training process: the step recorder's ring (the host's step starts), the device step timer
(the model's device periods, due once the device passed the next step's start), the window
coordinator (it only takes the periods) and the clocks, all in model time; the periodic thread
is a loop that drains every `tick_s` and reads the recorder every `read_every_s`, as the agent's
thread does, and delivers a window's analysis `analysis_s` after the window's last step.

`run_rank` returns every step's report; `carried_errors` compares the carried ones with the
model's truth.
"""

from __future__ import annotations

import collections
import json
import logging
import statistics
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

from mfuscope.agent._health import HealthCounters, RateLimitedLog
from mfuscope.agent._report_assembly import BatchHeader, ReportAssembler
from mfuscope.agent._runtime import _Device, _engine_analyse
from mfuscope.agent._step_flops import StepFlopsValue
from mfuscope.agent._step_recorder import CAPACITY, StepRecorder
from mfuscope.agent._step_reports import StepReporter
from mfuscope.agent._topology import GroupView, RankTopology, group_names
from mfuscope.agent._window_coordinator import WindowCoordinator, WindowResult
from mfuscope.agent.collective_reader import CollectiveReader
from mfuscope.agent.flight_recorder import DumpSource
from mfuscope.agent.step_timer import TimedStep
from mfuscope.core.schema import StepReport

from tests.support.fr_dumps import nccl_dump
from tests.support.gpu_step_model import (
    BASE_UNIX_NS,
    GROUP,
    FlightOp,
    ModelRank,
    StepShape,
    flight_entries,
    window_trace,
)

__all__ = [
    "AgentRun",
    "CarriedError",
    "carried_errors",
    "model_topology",
    "run_rank",
    "window_steps",
]

DEVICE = "NVIDIA H100 80GB HBM3"
MODEL_FLOPS = 4.0e13  # per step; any positive figure: every step has the same


def window_steps(steps: int, *, first: int = 10, every: int = 60, size: int = 3) -> list[int]:
    """The profiled steps: `size` steps every `every` from `first`."""
    return [s for s in range(steps) if s >= first and (s - first) % every < size]


class _Recorder:
    """What the reporter reads of the training thread's `StepRecorder` (the same fields)."""

    def __init__(self) -> None:
        self.begun = 0
        self.starts = [0] * CAPACITY
        self.first_step = 0
        self.depth = 0
        self.last_end_ns = 0
        self.read_thread_clock = None
        self.thread_starts = [b""] * CAPACITY
        value = StepFlopsValue(MODEL_FLOPS, 0.0, "given")
        self.flops_log: collections.deque[Any] = collections.deque([(0, value, value)])
        self.window_steps: collections.deque[int] = collections.deque()
        self.window_results: collections.deque[tuple[int, WindowResult]] = collections.deque()


class _Timer:
    """The device step timer: a step's period once the device passed the next step's start."""

    def __init__(self, rank: ModelRank, now: list[float]) -> None:
        self._steps = collections.deque(rank.steps)
        self._now = now

    def _due(self, everything: bool) -> list[TimedStep]:
        out = []
        while self._steps and (everything or self._steps[0].device_end <= self._now[0]):
            step = self._steps.popleft()
            start_ns = BASE_UNIX_NS + int(step.host_start * 1e3)
            out.append(TimedStep(step.step, start_ns, (step.device_end - step.device_start) / 1e6))
        return out

    def poll(self) -> list[TimedStep]:
        return self._due(False)

    def finish(self) -> list[TimedStep]:
        return self._due(True)


class _Windows:
    def observe_wall(self, step: int, wall_s: float) -> None:
        pass


class _Ring:
    """The rank's flight recorder at model time `now`: the newest `size` entries enqueued by
    then, each completed (with its duration) once the recorder has it so."""

    def __init__(self, ops: Sequence[FlightOp], now: list[float], size: int = 2000) -> None:
        self._ops = ops
        self._now = now
        self._size = size

    def __call__(self) -> dict[str, Any]:
        now = self._now[0]
        seen = [op for op in self._ops if op.created <= now][-self._size :]
        entries = []
        for op in seen:
            if op.done_at <= now:
                entries.append(op.entry)
            else:
                entry = {**op.entry, "state": "started", "retired": False}
                entry.pop("duration_ms", None)
                entry["time_discovered_completed_ns"] = None
                entries.append(entry)
        return nccl_dump(entries)


@dataclass
class AgentRun:
    """One rank's reports by step, and the steps that were profiled."""

    reports: dict[int, StepReport]
    windows: list[int]
    durations_seen: bool = False


def model_topology(rank: int) -> RankTopology:
    """The model's ranks as the agent's topology discovery names them: one group, axis dp, on
    one node."""
    view = GroupView(GROUP.name, GROUP.desc, GROUP.ranks, "dp", "intra_node", ("n0",))
    return RankTopology(
        rank=rank,
        local_rank=rank,
        world_size=len(GROUP.ranks),
        host="n0",
        host_of_rank=dict.fromkeys(GROUP.ranks, "n0"),
        groups=(view,),
        node_of_rank=dict.fromkeys(GROUP.ranks, "n0"),
        node="n0",
    )


def run_rank(
    rank: ModelRank,
    shape: StepShape,
    *,
    timed: bool = True,
    windows: Sequence[int] | None = None,
    tick_s: float = 0.1,
    read_every_s: float = 5.0,
    analysis_s: float = 1.5,
    trace_dir: str | None = None,
) -> AgentRun:
    """Drive the agent's report path through `rank`'s steps (see the module docstring).
    `timed`: the recorder's entries carry durations (NCCL timing on); False: none, as with
    timing off."""
    profiled = list(windows if windows is not None else window_steps(len(rank.steps)))
    now = [0.0]  # model µs
    topology = model_topology(rank.rank)
    log = RateLimitedLog(3600.0, logger=logging.getLogger("mfuscope.gpu-step-model"))
    health = HealthCounters()
    header = BatchHeader(
        job="gpu-step-model",
        rank=rank.rank,
        world_size=len(GROUP.ranks),
        local_rank=rank.rank,
        host="n0",
        device=DEVICE,
        peak_flops=989e12,
        peak_source="spec",
        topology=None,
        incarnation="model",
    )
    ops = flight_entries(rank, shape, timed=timed)
    source = DumpSource("nccl", _Ring(ops, now), json=False, native=False)
    clock_ns = lambda: int(now[0] * 1e3)  # noqa: E731 - the recorder's clock, model time
    wall_ns = lambda: BASE_UNIX_NS + int(now[0] * 1e3)  # noqa: E731
    reader = CollectiveReader(
        [source],
        group_names(topology),
        log=log,
        durations=timed,
        p2p_recorded=True,
        interval_s=read_every_s,
        wall_clock_ns=wall_ns,
    )
    assembler = ReportAssembler(header, health, timed=timed)
    recorder = _Recorder()
    shipped: list[StepReport] = []
    reporter = StepReporter(
        cast(StepRecorder, recorder),
        assembler=assembler,
        windows=cast(WindowCoordinator, _Windows()),
        ship=shipped.extend,
        health=health,
        log=log,
        timer=_Timer(rank, now),
        collectives=reader,
        clock_ns=clock_ns,
        wall_clock_ns=wall_ns,
    )
    reader.follow_steps(reporter.drain)
    reader.baseline()
    analyse = _engine_analyse(topology, _Device(DEVICE, True, None), lambda path: None, None)
    pending = _window_groups(profiled)
    steps = rank.steps
    next_read = read_every_s * 1e6
    # Past the last step's end and its collectives' completion, with every window delivered.
    last = max(steps[-1].device_end, max(op.done_at for op in ops) if ops else 0.0)
    end = max(last, steps[profiled[-1]].device_end + analysis_s * 1e6 if profiled else 0.0)
    with tempfile.TemporaryDirectory(dir=trace_dir) as tmp:
        while now[0] < end:
            now[0] += tick_s * 1e6
            while recorder.begun < len(steps) and steps[recorder.begun].host_start <= now[0]:
                n = recorder.begun
                recorder.starts[n % CAPACITY] = int(steps[n].host_start * 1e3)
                if n in profiled:
                    recorder.window_steps.append(n)
                recorder.begun = n + 1
            while pending and now[0] >= steps[pending[0][-1]].device_end + analysis_s * 1e6:
                group = pending.pop(0)
                path = Path(tmp) / f"window-{rank.rank}-{group[0]}.json"
                path.write_text(json.dumps(window_trace(rank, group, shape)))
                result = WindowResult(tuple(group), tuple(analyse(str(path))))
                recorder.window_results.append((recorder.begun - 1, result))
            reporter.drain()
            if now[0] >= next_read:
                reader.read_once()
                next_read += read_every_s * 1e6
        reporter.drain(final=True)
        reader.close(0.0)
        reporter.drain(final=True)
        shipped.extend(assembler.flush())
    return AgentRun({r.step: r for r in shipped}, profiled, durations_seen=reader.durations)


def _window_groups(profiled: Sequence[int]) -> list[list[int]]:
    groups: list[list[int]] = []
    for step in sorted(profiled):
        if groups and groups[-1][-1] == step - 1:
            groups[-1].append(step)
        else:
            groups.append([step])
    return groups


@dataclass(frozen=True)
class CarriedError:
    """Carried exposed communication against the model's truth over a rank's carried steps, in
    points (percent of a step): `by_time` the error of their summed seconds over their summed
    wall time (what a ratio of counters is off by), `mean_abs` and `worst` per step."""

    steps: int
    by_time: float
    mean_abs: float
    worst: float


def carried_errors(run: AgentRun, rank: ModelRank, component: str = "exposed_comm") -> CarriedError:
    """The carried steps' `component` seconds against the model's truth."""
    truth = {s.step: s.truth for s in rank.steps}
    profiled = set(run.windows)
    errors, wall, diff = [], 0.0, 0.0
    for step, report in sorted(run.reports.items()):
        if report.breakdown_step is None or step in profiled:
            continue
        true = truth[step]
        assert true is not None
        want = true.exposed_comm_s if component == "exposed_comm" else true.idle_s
        got = sum(c.seconds for c in report.components if c.component == component)
        errors.append(100 * (got - want) / report.wall_s)
        wall += report.wall_s
        diff += got - want
    if not errors:
        return CarriedError(0, 0.0, 0.0, 0.0)
    return CarriedError(
        len(errors),
        100 * diff / wall,
        statistics.fmean(abs(e) for e in errors),
        max(errors, key=abs),
    )
