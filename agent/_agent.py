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
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Any

from mfuscope.agent._health import LOGGER, HealthCounters, RateLimitedLog
from mfuscope.agent._runtime import Runtime, build_runtime
from mfuscope.agent.config import AgentConfig
from mfuscope.agent.flops_tracker import StepFlopsValue
from mfuscope.agent.sampler import ProfilerLike
from mfuscope.agent.step_timer import StepTimer, TimedStep
from mfuscope.agent.transport import Transport
from mfuscope.core.schema import ReportBatch, StepReport, batch_to_json
from mfuscope.core.step_report import make_report

__all__ = ["Agent", "Seams"]


@dataclass(frozen=True)
class Seams:
    """Test seams: replace the boundaries we cannot have here (CUDA, a failing profiler).

    Production code never passes these.
    """

    clock: Callable[[], float] | None = None  # monotonic seconds, for scheduling
    timer: StepTimer | None = None
    profiler_factory: Callable[[], ProfilerLike] | None = None
    analyse: Callable[[str], Sequence[Any]] | None = None
    logger: logging.Logger | None = None


class _StepScope:
    """The reusable context manager `Agent.step()` returns."""

    __slots__ = ("_agent",)

    def __init__(self, agent: Agent) -> None:
        self._agent = agent

    def __enter__(self) -> _StepScope:
        self._agent._begin_step()
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
    (argument > environment > default). `model` (optional) lets the agent notice input shape
    changes and recount FLOPs; `mesh` (a DeviceMesh, optional) names the parallelism axes.
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
        seams: Seams | None = None,
        **options: object,
    ) -> None:
        self.config = AgentConfig.resolve(
            {
                "job": job,
                "collector_url": collector_url,
                "flops_per_step": flops_per_step,
                "peak_flops": peak_flops,
                **options,
            }
        )
        seams = seams or Seams()
        self.health = HealthCounters()
        self._log = RateLimitedLog(self.config.log_interval_s, logger=seams.logger or LOGGER)
        self._step = 0
        self._depth = 0  # nesting of `with agent.step()`; only the outermost one is a step
        self._closed = False
        self._scope = _StepScope(self)
        self._step_flops: dict[int, StepFlopsValue] = {}
        self._held: dict[int, TimedStep] = {}
        self._runtime: Runtime | None = None
        self._transports: list[Transport] = []
        if not self.config.enabled:
            return
        self._runtime = build_runtime(
            self.config, model=model, mesh=mesh, seams=seams, health=self.health, log=self._log
        )
        self._transports = self._runtime.make_transports(self._encode)
        # A job that forgets close() still flushes at interpreter exit (bounded by the timeout).
        atexit.register(self.close)

    # --- public API ----------------------------------------------------------------------------

    def step(self) -> contextlib.AbstractContextManager[Any]:
        """Context manager around one training step (forward, backward, optimizer step)."""
        return self._scope

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
        runtime = self._runtime
        if runtime is None:
            return
        budget = self.config.close_timeout_s if timeout_s is None else timeout_s
        deadline = time.monotonic() + budget
        try:
            runtime.windows.close_window()
            for timed in runtime.timer.finish():
                self._finished(timed)
            self._release(runtime.windows.wait(max(deadline - time.monotonic(), 0.0) * 0.5))
            for step in sorted(self._held):
                self._emit(self._held.pop(step))
        except Exception as exc:
            self._internal_error("close", exc)
        for transport in self._transports:
            transport.close(max(deadline - time.monotonic(), 0.0))
        runtime.shutdown()

    def __enter__(self) -> Agent:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- per step (training thread) --------------------------------------------------------------

    def _begin_step(self) -> None:
        runtime = self._runtime
        if runtime is None or self._closed:
            return
        self._depth += 1
        if self._depth > 1:
            self._log.warning("nested-step", "mfuscope: agent.step() nested; inner one ignored")
            return
        step = self._step
        try:
            runtime.timer.begin(step)
        except Exception as exc:
            self._internal_error("timer", exc)
        try:
            # Never count FLOPs inside a profiled window: the counter would distort the trace.
            runtime.flops.begin_step(allow_count=not runtime.windows.recording)
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
            self._step_flops[step] = runtime.flops.end_step(failed=failed)
        except Exception as exc:
            runtime.flops.abort()
            self._internal_error("flop-count", exc)
        try:
            for timed in runtime.timer.poll():
                self._finished(timed)
            self._release(runtime.windows.poll())
        except Exception as exc:
            self._internal_error("report", exc)

    # --- reports -------------------------------------------------------------------------------

    def _finished(self, timed: TimedStep) -> None:
        runtime = self._runtime
        assert runtime is not None
        runtime.windows.observe_wall(timed.step, timed.wall_s)
        if runtime.windows.holds(timed.step):
            self._held[timed.step] = timed
        else:
            self._emit(timed)

    def _release(self, steps: Sequence[int]) -> None:
        for step in steps:
            timed = self._held.pop(step, None)
            if timed is not None:
                self._emit(timed)

    def _emit(self, timed: TimedStep) -> None:
        runtime = self._runtime
        assert runtime is not None
        flops = self._step_flops.pop(timed.step, None) or StepFlopsValue(0.0, 0.0, "unknown")
        own = runtime.windows.take_resolved(timed.step)
        report = make_report(
            step=timed.step,
            start_unix_ns=timed.start_unix_ns,
            wall_s=timed.wall_s,
            model_flops=flops.model_flops,
            recompute_flops=flops.recompute_flops,
            breakdown=own.breakdown if own is not None else runtime.windows.breakdown,
            collectives=own.collectives if own is not None else (),
        )
        for transport in self._transports:
            transport.submit(report)

    def _encode(self, reports: Sequence[StepReport]) -> bytes:
        """The wire batch for `reports` (called on a transport thread)."""
        runtime = self._runtime
        assert runtime is not None
        topology = runtime.topology
        batch = ReportBatch(
            job=self.config.job,
            rank=topology.rank,
            world_size=topology.world_size,
            local_rank=topology.local_rank,
            host=topology.host,
            device=runtime.device_name,
            peak_flops=runtime.peak_flops,
            peak_source=runtime.peak_source,
            sent_unix_ns=time.time_ns(),
            reports=tuple(reports),
            health=self.health.snapshot(),
            topology=runtime.schema_topology,
        )
        return batch_to_json(batch).encode()

    def _internal_error(self, where: str, exc: BaseException) -> None:
        self.health.add_internal_error()
        self._log.warning(
            f"internal-{where}", "mfuscope: agent error in %s (training continues): %r", where, exc
        )
