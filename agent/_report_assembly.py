"""Where the agent's step reports and wire batches are put together (the agent's periodic thread
and the transport threads; pure bookkeeping, no I/O).

A step's report needs three things that arrive at different times: its period (from the step
timer, possibly a few steps late on CUDA), its FLOPs (at the end of the step) and, for a step of
a profiled window, its window's analysis (seconds later, from a background thread). The
`ReportAssembler` keeps what has arrived, holds the reports of window steps until their result is
in, and returns each report once it is complete; the periodic thread (`_step_reports`) ships
them.

After a window's result each of its steps carries its *own* decomposition and collectives (its
seconds as measured on the trace, the rest of its period as the profiler's `instrumentation`), and
the window's average breakdown becomes the one every later step carries: on a CPU timeline with
its exposed communication taken from the step's own blocked time (`carried_components`). A
failed window's steps keep the previous breakdown and carry no collectives.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from mfuscope.agent._health import HealthCounters
from mfuscope.agent._window_coordinator import WindowResult
from mfuscope.agent.step_flops import StepFlopsValue
from mfuscope.agent.step_timer import TimedStep
from mfuscope.core.collective_records import CommRecords
from mfuscope.core.hwcounters import HardwareCounters
from mfuscope.core.run_key import fingerprint
from mfuscope.core.schema import CollectiveSample, ReportBatch, StepReport, Topology, encode_batch
from mfuscope.core.step_report import (
    BlockedSample,
    Breakdown,
    blocked_elsewhere_s,
    breakdown_from_steps,
    carried_breakdown,
    collective_samples,
    make_report,
)

__all__ = ["BatchHeader", "ReportAssembler"]

_NO_FLOPS = StepFlopsValue(0.0, 0.0, "unknown")


@dataclass(frozen=True)
class BatchHeader:
    """The rank-level facts every wire batch of this rank repeats (fixed at construction)."""

    job: str
    rank: int
    world_size: int
    local_rank: int
    host: str
    device: str
    peak_flops: float | None  # FLOP/s, None when unknown
    peak_source: str
    topology: Topology | None
    incarnation: str  # this launch's run id, the same on every rank (idempotency across restarts)
    node: str = ""  # the node label (docs/definitions.md#node-identity)
    dtype: str = ""  # the training dtype, for the run key's fingerprint
    run_key: str = ""  # the user's run key; "": the fingerprint, once FLOPs per step are known


@dataclass(frozen=True)
class _FromWindow:
    """What a profiled step's report carries from its window."""

    breakdown: Breakdown | None
    collectives: tuple[CollectiveSample, ...]
    # The step's window on the trace (s) when `breakdown` is its own; the rest of its period is
    # the profiler's own cost (instrumentation).
    measured_s: float | None = None


class ReportAssembler:
    """Builds each step's `StepReport` once its parts are in, and encodes batches of them.

    `flops_counted` and `step_finished` / `window_finished` / `flush` run on the agent's report
    thread (and at close on the closing thread, the periodic thread stopped); `encode` runs on a
    transport thread and reads only the fixed header, the health counters,
    the hardware sampler's latest counters (`hardware`, thread-safe; None without a sampler) and
    the collective reader's records (`comm`, thread-safe; None without a reader). Once `closing`
    is set (the agent's close), every batch says so.
    """

    def __init__(
        self,
        header: BatchHeader,
        health: HealthCounters,
        hardware: Callable[[], HardwareCounters | None] | None = None,
        comm: Callable[[str], CommRecords | None] | None = None,
    ) -> None:
        self._header = header
        self._health = health
        self._hardware = hardware
        self._comm = comm
        self.closing = False
        self._flops: dict[int, StepFlopsValue] = {}
        self._data_waits: dict[int, float] = {}  # s blocked in a data loader (CPU timelines)
        self._held: dict[int, TimedStep] = {}
        self._from_window: dict[int, _FromWindow] = {}
        self._last_finished: int | None = None  # the latest step whose period came in
        self.breakdown: Breakdown | None = None  # the latest window's, carried by later steps
        self._run_key = header.run_key

    def flops_counted(self, step: int, flops: StepFlopsValue) -> None:
        self._flops[step] = flops

    def data_waited(self, step: int, seconds: float) -> None:
        """How long `step`'s training thread was blocked in a data loader (CPU timelines; left
        out of its `blocked_s` already): beyond its window's, it is idle time."""
        self._data_waits[step] = seconds

    def step_finished(self, timed: TimedStep, *, hold: bool) -> list[StepReport]:
        """A step's period is in (steps come in order). `hold`: its window's analysis is still
        out, so wait for it."""
        if self._last_finished is None or timed.step > self._last_finished:
            self._last_finished = timed.step
        if hold:
            self._held[timed.step] = timed
            return []
        return [self._report(timed)]

    def resolved(self, step: int) -> bool:
        """Whether `step`'s window result is in already (its report need not be held)."""
        return step in self._from_window

    def window_finished(self, result: WindowResult | None) -> list[StepReport]:
        """Take a window's result (None: nothing new) and return the held reports it completes.
        Steps already reported and not held (a window released after its steps' reports went
        out) are left alone."""
        if result is None:
            return []
        done = self._last_finished
        if done is not None and any(s <= done and s not in self._held for s in result.steps):
            steps = tuple(s for s in result.steps if s > done or s in self._held)
            result = WindowResult(steps, result.decompositions)
            if not steps:
                return []
        window = (
            carried_breakdown(result.decompositions, max(result.steps))
            if result.decompositions
            else None
        )
        if window is None:
            for step in result.steps:
                self._from_window.setdefault(step, _FromWindow(self.breakdown, ()))
        else:
            # From this window's steps alone: a job whose blocked time elsewhere changed (a
            # data loader that got slower, a new sleep) is measured again by the next window,
            # which earlier windows must not outvote (pooling the last 3 kept a slowed job's
            # new idle time as communication, and its page named the wrong cause).
            elsewhere = blocked_elsewhere_s(self._blocked(result))
            waits = [
                self._data_waits[d.step]
                for d in result.decompositions
                if d.step in self._data_waits
            ]
            window = replace(
                window,
                blocked_elsewhere_s=elsewhere,
                data_wait_s=statistics.median(waits) if waits else None,
            )
            self.breakdown = window
            by_step = {d.step: d for d in result.decompositions}
            for step in result.steps:
                own = by_step.get(step)
                mine = None if own is None else breakdown_from_steps([own], step)
                self._from_window[step] = (
                    _FromWindow(window, () if own is None else collective_samples(own.collectives))
                    if own is None or mine is None
                    else _FromWindow(mine, collective_samples(own.collectives), own.wall_s)
                )
        return [self._report(self._held.pop(s)) for s in result.steps if s in self._held]

    def _blocked(self, result: WindowResult) -> list[BlockedSample]:
        """The window's steps' thread times beside their decomposition, in step order (CPU
        timelines)."""
        samples = []
        for decomposition in sorted(result.decompositions, key=lambda d: d.step):
            timed = self._held.get(decomposition.step)
            if timed is None or timed.blocked_s is None or timed.run_delay_s is None:
                continue
            samples.append(
                BlockedSample(
                    timed.blocked_s,
                    timed.run_delay_s,
                    decomposition.exposed_comm_s,
                    decomposition.bubble_idle_s,
                )
            )
        return samples

    def flush(self) -> list[StepReport]:
        """At close: every report still held, in step order, with what is known by now."""
        return [self._report(self._held.pop(step)) for step in sorted(self._held)]

    def encode(self, reports: Sequence[StepReport], sink: str = "") -> bytes:
        """The wire batch for `reports` (JSON bytes) for `sink` (each sink gets every arrival
        sample once)."""
        h = self._header
        batch = ReportBatch(
            job=h.job,
            rank=h.rank,
            world_size=h.world_size,
            local_rank=h.local_rank,
            host=h.host,
            device=h.device,
            peak_flops=h.peak_flops,
            peak_source=h.peak_source,
            sent_unix_ns=time.time_ns(),
            reports=tuple(reports),
            health=self._health.snapshot(),
            topology=h.topology,
            incarnation=h.incarnation,
            hardware=self._hardware() if self._hardware is not None else None,
            node=h.node,
            comm=self._comm(sink) if self._comm is not None else None,
            closing=self.closing,
            run_key=self._key(reports),
        )
        return encode_batch(batch)

    def _key(self, reports: Sequence[StepReport]) -> str:
        """The run key: the user's, else the fingerprint of the first FLOPs per step reported
        (kept from then on; "" until a report has FLOPs). Transport threads may race to set
        it: they compute the same value."""
        if not self._run_key:
            flops = next((r.model_flops for r in reports if r.model_flops > 0), None)
            if flops is not None:
                h = self._header
                layout = [(g.axis, g.size) for g in h.topology.groups] if h.topology else []
                self._run_key = fingerprint(flops, h.world_size, layout, h.device, h.dtype)
        return self._run_key

    def _report(self, timed: TimedStep) -> StepReport:
        flops = self._flops.pop(timed.step, None) or _NO_FLOPS
        data_wait_s = self._data_waits.pop(timed.step, None)
        own = self._from_window.pop(timed.step, None)
        return make_report(
            step=timed.step,
            start_unix_ns=timed.start_unix_ns,
            wall_s=timed.wall_s,
            model_flops=flops.model_flops,
            recompute_flops=flops.recompute_flops,
            breakdown=own.breakdown if own is not None else self.breakdown,
            collectives=own.collectives if own is not None else (),
            measured_s=own.measured_s if own is not None else None,
            blocked_s=timed.blocked_s,
            data_wait_s=data_wait_s,
        )
