"""The `Agent` facade: one object per training rank, one `with agent.step():` per step.

Everything here runs on the training thread and is cheap: a clock read (or CUDA event record),
a few dictionary operations and a queue append per step. Profiling, trace analysis and shipping
run elsewhere (see `sampler`, `transport`). No method raises into the training loop: telemetry
failures are caught, counted, and logged at most once per interval. Only constructor misuse
(a bad option) raises, at once, as `ConfigError`.
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
from types import TracebackType
from typing import Any

from mfuscope.agent._announce import ensure_visible, quiet_kineto, startup_line
from mfuscope.agent._health import LOGGER, HealthCounters, RateLimitedLog
from mfuscope.agent._report_assembly import ReportAssembler
from mfuscope.agent._runtime import Runtime, build_runtime
from mfuscope.agent.config import AgentConfig
from mfuscope.agent.sampler import ProfilerLike
from mfuscope.agent.step_flops import StepFlopsValue
from mfuscope.agent.step_timer import StepTimer, TimedStep
from mfuscope.agent.transport import Transport
from mfuscope.core.errors import InputError
from mfuscope.core.schema import StepReport

__all__ = ["Agent", "Seams", "agent_with_seams"]


@dataclass(frozen=True)
class Seams:
    """Test seams: replace the boundaries we cannot have here (CUDA, a failing profiler).

    Only tests pass these, through `agent_with_seams`; they are no part of `Agent(...)`.
    """

    clock: Callable[[], float] | None = None  # monotonic seconds, for scheduling
    timer: StepTimer | None = None
    profiler_factory: Callable[[], ProfilerLike] | None = None
    analyse: Callable[[str], Sequence[Any]] | None = None
    logger: logging.Logger | None = None
    nvml: Any = None  # an object with pynvml's functions, for the hardware-counter sampler
    sysfs_root: str | None = None  # the directory that plays `/` for NIC counters
    collective_sources: Sequence[Any] | None = None  # flight-recorder `DumpSource`s


class _StepScope:
    """The context manager `Agent.step()` returns (one reusable instance when no FLOPs are
    given; a fresh one carrying them otherwise)."""

    __slots__ = ("_agent", "_given")

    def __init__(self, agent: Agent, given: StepFlopsValue | None = None) -> None:
        self._agent = agent
        self._given = given

    def __enter__(self) -> _StepScope:
        self._agent._begin_step(self._given)
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        # Returns None: never swallows the training loop's own exceptions.
        self._agent._end_step(failed=exc_type is not None)


class Agent:
    """Live MFU/HFU and step decomposition for one training rank.

    ``Agent(job="llama-8b", collector_url="http://127.0.0.1:9464", model=model)`` then
    ``with agent.step(): ...`` around each training step and `close()` at the end. Every option
    of `AgentConfig` can be passed as a keyword or set as `MFUSCOPE_<NAME>` in the environment
    (argument > environment > `derived` > default). `derived` (for framework integrations) maps
    options to values the integration worked out (e.g. ``flops_per_step`` from the framework's
    own count): they apply only where the user set neither an argument nor the environment
    variable. `model` (optional) lets the agent notice input shape changes and recount FLOPs;
    `mesh` (a DeviceMesh, optional) names the parallelism axes.
    Construction is collective when torch.distributed is initialised: every rank must create
    its Agent (one `all_gather_object` of host names).
    """

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
        self._step = self.config.first_step
        self._depth = 0  # nesting of `with agent.step()`; only the outermost one is a step
        self._given: StepFlopsValue | None = None  # FLOPs given to the running step
        self._closed = False
        self._scope = _StepScope(self)
        self._runtime: Runtime | None = None
        self._reports: ReportAssembler | None = None
        self._transports: list[Transport] = []
        if not self.config.enabled:
            return
        self._runtime = build_runtime(
            self.config, model=model, mesh=mesh, seams=seams, health=self.health, log=self._log
        )
        hardware = self._runtime.hardware
        collectives = self._runtime.collectives
        self._reports = ReportAssembler(
            self._runtime.batch_header(),
            self.health,
            hardware=hardware.snapshot if hardware is not None else None,
            comm=collectives.records if collectives is not None else None,
        )
        self._transports = self._runtime.make_transports(self._reports.encode)
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
            )
        )

    # --- public API ----------------------------------------------------------------------------

    def step(
        self, *, flops: float | None = None, recompute_flops: float | None = None
    ) -> contextlib.AbstractContextManager[Any]:
        """Context manager around one training step (forward, backward, optimizer step).

        `flops`: this rank's model FLOPs for this step (the MFU numerator; recomputation
        excluded). It takes precedence over `flops_per_step` and over counting, and the step is
        not counted. `recompute_flops`: the step's activation-recomputation FLOPs (HFU adds them;
        default 0); only with `flops`. Each must be a finite number >= 0, else `InputError`.
        """
        if flops is None and recompute_flops is None:
            return self._scope
        return _StepScope(self, _given_step_flops(flops, recompute_flops))

    @property
    def rank(self) -> int:
        return self._runtime.topology.rank if self._runtime else 0

    def close(self, timeout_s: float | None = None) -> None:
        """Finish the last step, wait for an in-flight window analysis, flush every sink.

        Waits at most `timeout_s` (default: the `close_timeout_s` option) in total. Idempotent.
        """
        if self._closed:
            return
        self._closed = True
        atexit.unregister(self.close)
        runtime, reports = self._runtime, self._reports
        if runtime is None or reports is None:
            return
        budget = self.config.close_timeout_s if timeout_s is None else timeout_s
        deadline = time.monotonic() + budget
        try:
            runtime.windows.close_window()
            for timed in runtime.timer.finish():
                self._finished(timed)
            waited = runtime.windows.wait(max(deadline - time.monotonic(), 0.0) * 0.5)
            if runtime.collectives is not None:  # the last steps' collectives, then stop
                runtime.collectives.close(min(max(deadline - time.monotonic(), 0.0) * 0.25, 2.0))
            reports.closing = True  # every batch from here on says the job ended normally
            self._ship(reports.window_finished(waited))
            self._ship(reports.flush())
        except Exception as exc:
            self._internal_error("close", exc)
        for transport in self._transports:
            transport.request_status()  # a closing batch even when no report is left to send
            transport.close(max(deadline - time.monotonic(), 0.0))
        runtime.shutdown()

    def __enter__(self) -> Agent:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- per step (training thread) --------------------------------------------------------------

    def _begin_step(self, given: StepFlopsValue | None = None) -> None:
        runtime = self._runtime
        if runtime is None or self._closed:
            return
        self._depth += 1
        if self._depth > 1:
            self._log.warning("nested-step", "mfuscope: agent.step() nested; inner one ignored")
            return
        self._given = given
        step = self._step
        try:
            runtime.timer.begin(step)
            if runtime.collectives is not None:
                runtime.collectives.step_began(step)
        except Exception as exc:
            self._internal_error("timer", exc)
        try:
            # Never count FLOPs inside a profiled window: the counter would distort the trace
            # (a count due at an agreed window's first step waits, the window does not).
            runtime.flops.begin_step(
                allow_count=given is None
                and not (runtime.windows.recording or runtime.windows.opens_at(step))
            )
        except Exception as exc:
            runtime.flops.abort()
            self._internal_error("flop-count", exc)
        try:
            runtime.windows.begin_step(step, allowed=not runtime.flops.counting)
        except Exception as exc:
            self._internal_error("window", exc)

    def _end_step(self, *, failed: bool) -> None:
        runtime = self._runtime
        if runtime is None or self._closed or self._depth == 0:
            return
        self._depth -= 1
        if self._depth > 0:
            return
        step = self._step
        self._step += 1
        try:
            runtime.windows.end_step(step)
        except Exception as exc:
            self._internal_error("window", exc)
        try:
            runtime.timer.end(step)
        except Exception as exc:
            self._internal_error("timer", exc)
        try:
            given, self._given = self._given, None
            self._flops_counted(step, runtime.flops.end_step(failed=failed, given=given))
        except Exception as exc:
            runtime.flops.abort()
            self._internal_error("flop-count", exc)
        try:
            for timed in runtime.timer.poll():
                self._finished(timed)
            if self._reports is not None:
                result = runtime.windows.poll()
                if result is not None:  # most steps: no window finished, nothing to ship
                    self._ship(self._reports.window_finished(result))
        except Exception as exc:
            self._internal_error("report", exc)

    # --- reports (assembled by `ReportAssembler`; the facade only ships them) ------------------

    def _flops_counted(self, step: int, flops: StepFlopsValue) -> None:
        if self._reports is not None:
            self._reports.flops_counted(step, flops)

    def _finished(self, timed: TimedStep) -> None:
        runtime, reports = self._runtime, self._reports
        assert runtime is not None and reports is not None
        runtime.windows.observe_wall(timed.step, timed.wall_s)
        self._ship(reports.step_finished(timed, hold=runtime.windows.holds(timed.step)))

    def _ship(self, reports: Sequence[StepReport]) -> None:
        for report in reports:
            for transport in self._transports:
                transport.submit(report)

    def _internal_error(self, where: str, exc: BaseException) -> None:
        self.health.add_internal_error()
        self._log.warning(
            f"internal-{where}", "mfuscope: agent error in %s (training continues): %r", where, exc
        )


def _given_step_flops(flops: float | None, recompute_flops: float | None) -> StepFlopsValue:
    """The FLOPs given to `agent.step(...)`, checked (one-line `InputError` on bad input)."""
    if flops is None:
        raise InputError(
            "agent.step(recompute_flops=...) needs flops=... too (this rank's model FLOPs)"
        )
    checked: list[float] = []
    for name, value in (("flops", flops), ("recompute_flops", recompute_flops or 0.0)):
        if (
            isinstance(value, bool)
            or not isinstance(value, numbers.Real)
            or not (math.isfinite(value) and value >= 0)
        ):
            raise InputError(
                f"agent.step({name}=...) must be a finite number >= 0 (FLOPs), got {value!r}"
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
