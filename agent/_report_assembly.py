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

Where the flight recorder times this rank's collectives (NCCL with timing on), a later step's
report also waits for the step's own collective durations (`durations_known`, from the
collective reader's next read: at most `collective_read_interval_s` later) and carries the
window's seconds with its own exposed communication (`core.carried_durations`); a step whose
durations do not come within `durations_wait_s` of the steps after it, or are not all known,
carries the window's shares.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace

from mfuscope.agent._health import HealthCounters
from mfuscope.agent._step_flops import StepFlopsValue
from mfuscope.agent._window_coordinator import WindowResult
from mfuscope.agent.step_timer import TimedStep
from mfuscope.core.carried_durations import ClassKey, window_seconds
from mfuscope.core.collective_records import CommRecords
from mfuscope.core.flight_accounting import StepDurationsUpdate
from mfuscope.core.hwcounters import HardwareCounters
from mfuscope.core.ledger import LedgerTotals
from mfuscope.core.run_key import fingerprint
from mfuscope.core.schema import CollectiveSample, ReportBatch, StepReport, Topology, encode_batch
from mfuscope.core.step_report import (
    BlockedSample,
    Breakdown,
    blocked_elsewhere_s,
    breakdown_from_steps,
    carried_breakdown,
    carried_steps,
    collective_samples,
    make_report,
)

__all__ = ["BatchHeader", "ReportAssembler"]

_NO_FLOPS = StepFlopsValue(0.0, 0.0, "unknown")
# How long a carried step's report waits for its collective durations, counted in the time its
# later steps started (s): past it the recorder is taken to have stopped answering.
DURATIONS_WAIT_S = 30.0


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
    the collective reader's records (`comm`, thread-safe; None without a reader) and the
    rank's job-time totals (`ledger`, a record replaced whole; None: not kept). Once `closing`
    is set (the agent's close), every batch says so.

    `timed`: this rank's collectives have durations (NCCL with timing on), so carried steps wait
    for theirs (`durations_known`; later updates say it again); `durations_wait_s`: at most how
    long, in step start times (`DURATIONS_WAIT_S`).
    """

    def __init__(
        self,
        header: BatchHeader,
        health: HealthCounters,
        hardware: Callable[[], HardwareCounters | None] | None = None,
        comm: Callable[[str], CommRecords | None] | None = None,
        ledger: Callable[[], LedgerTotals] | None = None,
        *,
        timed: bool = False,
        durations_wait_s: float = DURATIONS_WAIT_S,
    ) -> None:
        self._header = header
        self._health = health
        self._hardware = hardware
        self._comm = comm
        self._ledger = ledger
        self.closing = False
        self._flops: dict[int, StepFlopsValue] = {}
        self._data_waits: dict[int, float] = {}  # s blocked in a data loader (CPU timelines)
        self._held: dict[int, TimedStep] = {}
        self._from_window: dict[int, _FromWindow] = {}
        self._last_finished: int | None = None  # the latest step whose period came in
        self.breakdown: Breakdown | None = None  # the latest window's, carried by later steps
        self._run_key = header.run_key
        self._timed = timed
        self._wait_ns = int(durations_wait_s * 1e9)
        # Steps' collective seconds known and not used yet (None: not all known), and the step
        # up to which every step's are in.
        self._durations: dict[int, Mapping[ClassKey, float] | None] = {}
        self._through: int | None = None
        # Carried steps waiting for their durations, with the breakdown they carry.
        self._awaiting: dict[int, tuple[TimedStep, Breakdown]] = {}

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
            return self._overdue(timed)
        breakdown = self.breakdown
        if (
            self._timed
            and breakdown is not None
            and breakdown.seconds is not None
            and timed.step not in self._from_window
            and (self._through is None or timed.step > self._through)
        ):
            self._awaiting[timed.step] = (timed, breakdown)
            return self._overdue(timed)
        return [self._report(timed), *self._overdue(timed)]

    def durations_known(self, update: StepDurationsUpdate) -> list[StepReport]:
        """Take the collective reader's newly complete steps (their collective seconds) and
        return the reports of the carried steps they complete."""
        self._timed = update.timed
        self._durations.update(update.steps)
        if update.through is not None and (self._through is None or update.through > self._through):
            self._through = update.through
        through = self._through
        ready = sorted(s for s in self._awaiting if through is not None and s <= through)
        if not self._timed:  # no durations will come: nothing waits
            ready = sorted(self._awaiting)
        reports = [self._report(*self._awaiting.pop(s)) for s in ready]
        done = self._last_finished
        if done is not None:  # steps reported already use none (they come in order)
            for step in [s for s in self._durations if s <= done and s not in self._awaiting]:
                del self._durations[step]
        return reports

    def _overdue(self, latest: TimedStep) -> list[StepReport]:
        """The waiting steps that started more than the wait before `latest`: they carry the
        window's shares."""
        limit = latest.start_unix_ns - self._wait_ns
        late = sorted(s for s, (t, _) in self._awaiting.items() if t.start_unix_ns < limit)
        return [self._report(*self._awaiting.pop(s)) for s in late]

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
            chosen = carried_steps(sorted(result.decompositions, key=lambda s: s.step))
            seconds = window_seconds(chosen, *self._window_flops([d.step for d in chosen]))
            waits = [
                self._data_waits[d.step]
                for d in result.decompositions
                if d.step in self._data_waits
            ]
            window = replace(
                window,
                blocked_elsewhere_s=elsewhere,
                seconds=seconds,
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

    def _window_flops(self, steps: Sequence[int]) -> tuple[float | None, float | None]:
        """The mean model and recompute FLOPs of the window's `steps` (None: none known)."""
        known = [f for s in steps if (f := self._flops.get(s)) is not None and f.model_flops > 0]
        if not known:
            return None, None
        return (
            sum(f.model_flops for f in known) / len(known),
            sum(f.recompute_flops for f in known) / len(known),
        )

    def flush(self) -> list[StepReport]:
        """At close: every report still held or waiting, in step order, with what is known by
        now."""
        held: list[tuple[TimedStep, Breakdown | None]] = [(t, None) for t in self._held.values()]
        held += self._awaiting.values()
        self._held.clear()
        self._awaiting.clear()
        return [self._report(t, b) for t, b in sorted(held, key=lambda pair: pair[0].step)]

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
            ledger=self._ledger() if self._ledger is not None else None,
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

    def _report(self, timed: TimedStep, carried: Breakdown | None = None) -> StepReport:
        """`carried`: the breakdown a step that waited for its durations carries (else the
        latest)."""
        flops = self._flops.pop(timed.step, None) or _NO_FLOPS
        data_wait_s = self._data_waits.pop(timed.step, None)
        own = self._from_window.pop(timed.step, None)
        return make_report(
            step=timed.step,
            start_unix_ns=timed.start_unix_ns,
            wall_s=timed.wall_s,
            model_flops=flops.model_flops,
            recompute_flops=flops.recompute_flops,
            breakdown=own.breakdown if own is not None else carried or self.breakdown,
            collectives=own.collectives if own is not None else (),
            measured_s=own.measured_s if own is not None else None,
            blocked_s=timed.blocked_s,
            durations=self._durations.pop(timed.step, None) if own is None else None,
            data_wait_s=data_wait_s,
        )
