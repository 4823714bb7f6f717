"""The `Agent` facade: one object per training rank, one `with agent.step():` per step, or one
`agent.mark_step()` at the top of each iteration.

On the training thread a step costs a clock read per boundary and a few stores into a
preallocated ring, plus on CPU timelines one `pread` of the thread's schedstat line, or on GPU one
CUDA event record per boundary (`_step_recorder`, whose docstring says what that hot path may do);
the steps that open or take a profiled window, count FLOPs or follow a window decision do more,
and are known in advance. The agent's own threads: the periodic thread (`_periodic`: step reports,
collective records, hardware counters, window agreement), the analyser (`profiler_windows`, from
the first window on) and one per sink (`transport`: HTTP and/or JSONL), so two to four. No method
raises into the training loop: telemetry failures are caught, counted, and logged at most once per
interval. Only constructor misuse (a bad option) and bad `agent.step(flops=...)` /
`agent.mark_step(flops=...)` arguments raise, at once (`ConfigError`, `InputError`).
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import math
import numbers
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from mfuscope.agent._announce import ensure_visible, quiet_kineto, startup_line
from mfuscope.agent._health import LOGGER, HealthCounters, RateLimitedLog
from mfuscope.agent._job_time import JobTime
from mfuscope.agent._phases import Phase
from mfuscope.agent._process_start import process_start_unix_ns
from mfuscope.agent._profiler_windows import ProfilerLike
from mfuscope.agent._report_assembly import DURATIONS_WAIT_S, ReportAssembler
from mfuscope.agent._runtime import Runtime, build_runtime
from mfuscope.agent._step_flops import StepFlopsValue
from mfuscope.agent._step_recorder import GivenStep, StepRecorder
from mfuscope.agent._step_reports import StepReporter
from mfuscope.agent._thread_clock import ThreadClock
from mfuscope.agent._transport import Transport
from mfuscope.agent.config import AgentConfig
from mfuscope.agent.step_timer import DeviceEventStepTimer
from mfuscope.core.errors import InputError
from mfuscope.core.schema import StepReport

__all__ = ["Agent", "Seams", "agent_with_seams"]


@dataclass(frozen=True)
class Seams:
    """Test seams: replace the boundaries we cannot have here (CUDA, a failing profiler).

    Only tests pass these, through `agent_with_seams`; they are no part of `Agent(...)`.
    """

    clock: Callable[[], float] | None = None  # monotonic seconds, for scheduling
    # a device step timer over fake CUDA calls (on CPU the agent uses the host clock)
    timer: DeviceEventStepTimer | None = None
    profiler_factory: Callable[[], ProfilerLike] | None = None
    analyse: Callable[[str], Sequence[Any]] | None = None
    logger: logging.Logger | None = None
    nvml: Any = None  # an object with pynvml's functions, for the hardware-counter sampler
    sysfs_root: str | None = None  # the directory that plays `/` for NIC counters
    collective_sources: Sequence[Any] | None = None  # flight-recorder `DumpSource`s
    # opens the training thread's schedstat reader (None: `thread_clock.open_thread_clock`)
    thread_clock: Callable[[], ThreadClock | None] | None = None


class _NoStep:
    """What `agent.step()` returns when the agent is disabled: nothing at all."""

    __slots__ = ()

    def __enter__(self) -> _NoStep:
        return self

    def __exit__(self, *exc: object) -> None:
        return None


_NO_STEP = _NoStep()


def _no_mark() -> None:
    """What `agent.mark_step()` calls when the agent is disabled: nothing at all."""


class Agent:
    """Live MFU/HFU and step decomposition for one training rank.

    ``Agent(job="llama-8b", collector_url="http://127.0.0.1:9464", model=model)`` then
    ``with agent.step(): ...`` around each training step, or ``agent.mark_step()`` at the top of
    each iteration, and `close()` at the end. Every option
    of `AgentConfig` can be passed as a keyword or set as `MFUSCOPE_<NAME>` in the environment
    (argument > environment > `derived` > default). `derived` (for framework integrations) maps
    options to values the integration worked out (e.g. ``flops_per_step`` from the framework's
    own count): they apply only where the user set neither an argument nor the environment
    variable. `model` (optional) lets the agent notice input shape changes and recount FLOPs;
    `mesh` (a DeviceMesh, optional) names the parallelism axes.
    Construction is collective when torch.distributed is initialised: every rank must create
    its Agent (one `all_gather_object` of host names).
    """

    # Slots: `step()` reads `_scope` (`mark_step()`: `_mark`) from the agent object itself on
    # every step (an instance dictionary would be one more memory line to fetch, and a cold one
    # after a training step).
    __slots__ = (
        "__weakref__",
        "_closed",
        "_log",
        "_mark",
        "_recorder",
        "_reporter",
        "_reports",
        "_runtime",
        "_scope",
        "_transports",
        "config",
        "health",
    )
    _scope: contextlib.AbstractContextManager[Any]  # what `step()` returns
    _mark: Callable[[], None]  # what `mark_step()` calls

    def __init__(
        self,
        job: str | None = None,
        collector_url: str | None = None,
        *,
        model: Any = None,
        flops_per_step: float | None = None,
        peak_flops: float | None = None,
        mesh: Any = None,
        derived: Mapping[str, object] | None = None,
        **options: object,
    ) -> None:
        self._start(
            {
                "job": job,
                "collector_url": collector_url,
                "flops_per_step": flops_per_step,
                "peak_flops": peak_flops,
                **options,
            },
            model=model,
            mesh=mesh,
            seams=Seams(),
            derived=derived,
        )

    def _start(
        self,
        options: dict[str, object],
        *,
        model: Any,
        mesh: Any,
        seams: Seams,
        derived: Mapping[str, object] | None = None,
    ) -> None:
        self.config = AgentConfig.resolve(options, derived=derived)
        self.health = HealthCounters()
        self._log = RateLimitedLog(self.config.log_interval_s, logger=seams.logger or LOGGER)
        self._closed = False
        self._recorder: StepRecorder | None = None
        self._scope = _NO_STEP  # what step() returns
        self._mark = _no_mark  # what mark_step() calls
        self._runtime: Runtime | None = None
        self._reports: ReportAssembler | None = None
        self._reporter: StepReporter | None = None
        self._transports: list[Transport] = []
        if not self.config.enabled:
            return
        runtime = self._runtime = build_runtime(
            self.config, model=model, mesh=mesh, seams=seams, health=self.health, log=self._log
        )
        self._recorder = self._scope = runtime.recorder
        self._mark = runtime.recorder.mark
        hardware = runtime.hardware
        collectives = runtime.collectives
        job_time = _job_time(runtime.recorder, self._log)
        self._reports = ReportAssembler(
            runtime.batch_header(),
            self.health,
            hardware=hardware.snapshot if hardware is not None else None,
            comm=collectives.records if collectives is not None else None,
            timed=collectives is not None and collectives.durations,
            # Carried steps wait for the reader's next reads, however far apart they are.
            durations_wait_s=max(DURATIONS_WAIT_S, 3 * self.config.collective_read_interval_s),
            ledger=lambda: job_time.totals,
        )
        self._transports = runtime.make_transports(self._reports.encode)
        self._reporter = StepReporter(
            runtime.recorder,
            assembler=self._reports,
            windows=runtime.windows,
            ship=self._ship,
            health=self.health,
            log=self._log,
            timer=runtime.timer,
            collectives=collectives,
            job_time=job_time,
            known_waits=runtime.known_waits,
        )
        if collectives is not None:
            collectives.follow_steps(self._reporter.drain)
        self._reporter.start(runtime.periodic)
        self._announce(seams)
        # A job that forgets close() still flushes at interpreter exit (bounded by the timeout).
        atexit.register(self.close)

    def _announce(self, seams: Seams) -> None:
        """Rank 0's start-up line; quiet Kineto's per-window stderr lines (docs/agent.md, "Log")."""
        runtime = self._runtime
        assert runtime is not None
        if self.config.profile:
            quiet_kineto()
        if runtime.topology.rank != 0:
            return
        logger = seams.logger or LOGGER
        if seams.logger is None:
            ensure_visible(logger)
        logger.info(
            startup_line(
                self.config,
                world_size=runtime.topology.world_size,
                device=runtime.device_name,
                peak_flops=runtime.peak_flops,
                peak_source=runtime.peak_source,
                peak_note=runtime.peak_note,
            )
        )

    # --- public API ----------------------------------------------------------------------------

    def step(
        self, flops: float | None = None, recompute_flops: float | None = None
    ) -> contextlib.AbstractContextManager[Any]:
        """Context manager around one training step (forward, backward, optimizer step).

        `flops`: this rank's model FLOPs for this step (the MFU numerator; recomputation
        excluded). It takes precedence over `flops_per_step` and over counting, and the step is
        not counted. `recompute_flops`: the step's activation-recomputation FLOPs (HFU adds them;
        default 0); only with `flops`. Each must be a finite number >= 0, else `InputError`.
        """
        # Not keyword-only: a call without arguments then fills them from the function's
        # defaults tuple rather than its keyword-defaults dictionary, measurably cheaper.
        if flops is None and recompute_flops is None:
            return self._scope
        given = _given_step_flops(flops, recompute_flops, "step")
        recorder = self._recorder
        return _NO_STEP if recorder is None else GivenStep(recorder, given)

    def mark_step(self, flops: float | None = None, recompute_flops: float | None = None) -> None:
        """Begin the next training step here, ending the one before: one call at the top of each
        iteration (with gradient accumulation, of each optimizer step), for loops that do not
        want a `with` block. It costs what `with agent.step():` costs.

        A step begun here runs until the next `mark_step()`, a `with agent.step():` block, or
        `close()` (which ends the last one; `with Agent(...) as agent:` ends it as failed when
        the block raised). Called inside a `with agent.step():` block it is ignored (logged once).
        `flops` / `recompute_flops`: as for `step()`, of the step begun here.
        """
        if flops is None and recompute_flops is None:
            self._mark()
            return
        given = _given_step_flops(flops, recompute_flops, "mark_step")
        recorder = self._recorder
        if recorder is not None:
            recorder.mark_given(given)

    def phase(self, name: str) -> Phase:
        """Context manager around time between steps that is no step: ``with
        agent.phase("checkpoint_save"): ...``. It comes out of the step before it and counts as
        its phase in the job-time ledger (docs/definitions.md#job-time-ledger): `name`
        ``checkpoint_save``, ``checkpoint_load`` or ``evaluation``, any other name counting as
        ``other_phase``. Costs a clock read at each end; inside a step it is part of the step."""
        return Phase(self._recorder, name, self._log)

    @property
    def rank(self) -> int:
        return self._runtime.topology.rank if self._runtime else 0

    @property
    def _step(self) -> int:
        """The number the next step will have."""
        recorder = self._recorder
        return recorder.next_step if recorder is not None else self.config.first_step

    def close(self, timeout_s: float | None = None) -> None:
        """Finish the last step, wait for an in-flight window analysis, flush every sink.

        Waits at most `timeout_s` (default: the `close_timeout_s` option) in total. Idempotent.
        A step begun by `mark_step()` ends here.
        """
        self._close(timeout_s)

    def _close(self, timeout_s: float | None = None, *, failed: bool = False) -> None:
        """`close()`; `failed`: the training loop raised (a marked step still open failed)."""
        if self._closed:
            return
        self._closed = True
        atexit.unregister(self.close)
        runtime, reports, recorder, reporter = (
            self._runtime,
            self._reports,
            self._recorder,
            self._reporter,
        )
        if runtime is None or reports is None or recorder is None or reporter is None:
            return
        budget = self.config.close_timeout_s if timeout_s is None else timeout_s
        deadline = time.monotonic() + budget

        def left(share: float = 1.0) -> float:
            return max(deadline - time.monotonic(), 0.0) * share

        try:
            recorder.close(failed=failed)  # no step is recorded from here on
            runtime.windows.close_window()
            last = recorder.next_step - 1
            while (released := runtime.windows.poll()) is not None:
                recorder.window_results.append((last, released))
            reporter.stop(min(left(0.1), 1.0))  # from here on this thread drains
            reporter.drain(final=True, timeout_s=left(0.2))  # every step, the last to its end
            waited = runtime.windows.wait(left(0.5))
            if waited is not None:
                recorder.window_results.append((last, waited))
            if runtime.collectives is not None:  # the last steps' collectives, then stop
                runtime.collectives.close(min(left(0.25), 2.0))
            reports.closing = True  # every batch from here on says the job ended normally
            reporter.drain(final=True, timeout_s=left(0.2))  # the window's held reports
            self._ship(reports.flush())
        except Exception as exc:
            recorder.internal_error("close", exc)
        for transport in self._transports:
            transport.request_status()  # a closing batch even when no report is left to send
            transport.close(left())
        runtime.shutdown()

    def __enter__(self) -> Agent:
        return self

    def __exit__(self, *exc: object) -> None:
        self._close(failed=exc[0] is not None)

    # --- shipping (the periodic thread; at close the closing thread) ----------------------------

    def _ship(self, reports: Sequence[StepReport]) -> None:
        for report in reports:
            for transport in self._transports:
                transport.submit(report)


def _job_time(recorder: StepRecorder, log: RateLimitedLog) -> JobTime:
    """The rank's part of the job-time ledger, from its process's start (the agent's own start
    where the kernel cannot tell: said once)."""
    offset_ns = time.time_ns() - time.perf_counter_ns()  # wall clock - the recorder's clock
    start_unix_ns = process_start_unix_ns()
    if start_unix_ns is None:
        log.info("process-start", "mfuscope: process start unknown; startup counts from here")
        start_unix_ns = time.perf_counter_ns() + offset_ns
    return JobTime(recorder, start_unix_ns - offset_ns, start_unix_ns)


def _given_step_flops(
    flops: float | None, recompute_flops: float | None, method: str
) -> StepFlopsValue:
    """The FLOPs given to `agent.<method>(...)`, checked (one-line `InputError` on bad input)."""
    if flops is None:
        raise InputError(
            f"agent.{method}(recompute_flops=...) needs flops=... too (this rank's model FLOPs)"
        )
    checked: list[float] = []
    for name, value in (("flops", flops), ("recompute_flops", recompute_flops or 0.0)):
        if (
            isinstance(value, bool)
            or not isinstance(value, numbers.Real)
            or not (math.isfinite(value) and value >= 0)
        ):
            raise InputError(
                f"agent.{method}({name}=...) must be a finite number >= 0 (FLOPs), got {value!r}"
            )
        checked.append(float(value))
    return StepFlopsValue(checked[0], checked[1], "given")


def agent_with_seams(seams: Seams, job: str | None = None, **options: Any) -> Agent:
    """An `Agent` whose untestable boundaries are replaced by `seams` (tests only).

    Takes the same arguments as `Agent(...)`; `model` and `mesh` are passed through.
    """
    agent = Agent.__new__(Agent)
    model, mesh = options.pop("model", None), options.pop("mesh", None)
    derived = options.pop("derived", None)
    agent._start({"job": job, **options}, model=model, mesh=mesh, seams=seams, derived=derived)
    return agent
