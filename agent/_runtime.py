"""Assembles an Agent's parts once at construction (imports torch; never at package import).

Peak precedence (DESIGN §2, issue 3): `peak_flops` given (source ``user``) > the hardware table
for the detected device and `dtype` (``spec``) > on CPU a short matmul calibration
(``measured``) > unknown (reports carry ``peak_flops=None``, and the agent logs once how to pass
it). Link peaks: detected links first, then the device's defaults (`hardware.link_for_tier`).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from mfuscope.agent._health import HealthCounters, RateLimitedLog
from mfuscope.agent._windows import WindowCoordinator
from mfuscope.agent.config import AgentConfig
from mfuscope.agent.flops_tracker import CountSession, FlopsTracker
from mfuscope.agent.recompute import wrap_checkpoint
from mfuscope.agent.reports import DecompositionLike
from mfuscope.agent.sampler import (
    WindowAnalyser,
    WindowRecorder,
    WindowSchedule,
    torch_profiler_busy,
    torch_profiler_factory,
)
from mfuscope.agent.sinks import HttpSink, JsonlSink, Sink
from mfuscope.agent.step_timer import DeviceEventStepTimer, HostStepTimer, StepTimer
from mfuscope.agent.topology import RankTopology, build_topology, discover_topology
from mfuscope.agent.transport import RetryPolicy, Transport
from mfuscope.core.schema import StepReport, Topology

if TYPE_CHECKING:
    from mfuscope.agent._agent import Seams

__all__ = ["Runtime", "build_runtime"]

# Long enough for a stable best-of-batches matmul rate, short enough for start-up (issue 3 default).
CALIBRATION_S = 0.5


@dataclass
class Runtime:
    config: AgentConfig
    health: HealthCounters
    log: RateLimitedLog
    topology: RankTopology
    schema_topology: Topology
    device_name: str
    peak_flops: float | None
    peak_source: str
    timer: StepTimer
    flops: FlopsTracker
    windows: WindowCoordinator
    analyser: WindowAnalyser
    unwrap_checkpoint: Callable[[], None]

    def make_transports(self, encode: Callable[[Sequence[StepReport]], bytes]) -> list[Transport]:
        sinks: list[Sink] = []
        if self.config.collector_url:
            sinks.append(HttpSink(self.config.collector_url, self.config.token))
        if self.config.jsonl_path:
            sinks.append(
                JsonlSink(self.config.jsonl_path.replace("{rank}", str(self.topology.rank)))
            )
        if not sinks:
            self.log.warning(
                "no-sink",
                "mfuscope: neither collector_url nor jsonl_path is set (MFUSCOPE_COLLECTOR_URL / "
                "MFUSCOPE_JSONL_PATH): reports are measured but not shipped",
            )
        retry = RetryPolicy(
            max_attempts=self.config.max_send_attempts or None,
            base_s=self.config.retry_base_s,
            max_s=self.config.retry_max_s,
            request_timeout_s=self.config.request_timeout_s,
        )
        return [
            Transport(
                sink,
                encode,
                self.health,
                self.log,
                max_queue_reports=self.config.max_queue_reports,
                max_batch_reports=self.config.max_batch_reports,
                flush_interval_s=self.config.flush_interval_s,
                retry=retry,
            )
            for sink in sinks
        ]

    def shutdown(self) -> None:
        """Undo what construction installed; never raises."""
        with contextlib.suppress(Exception):
            self.unwrap_checkpoint()
        with contextlib.suppress(Exception):
            self.flops.close()
        with contextlib.suppress(Exception):
            self.analyser.close(0.5)


@dataclass(frozen=True)
class _Device:
    name: str
    use_cuda: bool
    links: Any  # mfuscope.core.links.DetectedLinks | None


def _topology(mesh: Any, log: RateLimitedLog) -> RankTopology:
    try:
        return discover_topology(mesh)
    except Exception as exc:
        log.warning("topology", "mfuscope: topology discovery failed (%r); tiers unknown", exc)
        import os
        import socket

        import torch.distributed as dist

        initialised = dist.is_available() and dist.is_initialized()
        rank = dist.get_rank() if initialised else int(os.environ.get("RANK", 0))
        world = dist.get_world_size() if initialised else int(os.environ.get("WORLD_SIZE", 1))
        hosts: list[str | None] = [None] * max(world, rank + 1)
        hosts[rank] = socket.gethostname()
        local_rank = int(os.environ.get("LOCAL_RANK", 0))
        return build_topology(rank=rank, local_rank=local_rank, hosts=hosts, groups=())


def _device(model: Any, topology: RankTopology, log: RateLimitedLog) -> _Device:
    """The device this rank trains on, and its links as detection (NVML, sysfs) sees them.

    The name comes from torch for the current CUDA device (authoritative for the device in use);
    NVML supplies NVLink / PCIe / NIC facts for that local index (physical and CUDA indices agree
    unless CUDA_VISIBLE_DEVICES reorders them; detection is best effort).
    """
    import torch

    use_cuda = torch.cuda.is_available()
    if model is not None and hasattr(model, "parameters"):
        first = next(iter(model.parameters()), None)
        if first is not None:
            use_cuda = first.device.type == "cuda"
    index = torch.cuda.current_device() if use_cuda else topology.local_rank
    name = torch.cuda.get_device_name(index) if use_cuda else "cpu"
    links = None
    try:
        from mfuscope.agent.detect import detect_hardware

        facts = detect_hardware()
        links = facts.links_for(index)
        for reason in facts.reasons:
            log.info(f"detect-{reason[:40]}", "mfuscope: hardware detection: %s", reason)
    except Exception as exc:  # detection must never stop the job
        log.info("detect", "mfuscope: hardware detection unavailable (%r)", exc)
    return _Device(name=name, use_cuda=use_cuda, links=links)


def _peak(config: AgentConfig, device: _Device, log: RateLimitedLog) -> tuple[float | None, str]:
    from mfuscope.core.hardware import resolve_peak

    dtype = config.dtype or ("bf16" if device.use_cuda else "fp32")
    lookup = resolve_peak(device.name, dtype, config.peak_flops)
    if lookup.peak_flops is not None:
        return lookup.peak_flops, lookup.source
    if not device.use_cuda and config.calibrate_cpu_peak:
        try:
            from mfuscope.agent.calibrate import measure_cpu_peak_flops

            value = measure_cpu_peak_flops(dtype, seconds=CALIBRATION_S)
            if value >= 1.0:
                return value, "measured"
        except Exception as exc:
            log.warning("calibrate", "mfuscope: CPU peak calibration failed: %r", exc)
    log.warning(
        "peak-unknown", "mfuscope: peak FLOP/s unknown, MFU not computed: %s", lookup.message
    )
    return None, "unknown"


def _link_peaks(device: _Device) -> tuple[dict[str, float], dict[str, Any]]:
    """Tier -> unidirectional peak bytes/s, and tier -> LinkModel for the engine."""
    from mfuscope.core.hardware import link_for_tier

    peaks: dict[str, float] = {}
    models: dict[str, Any] = {}
    name = None if device.name == "cpu" else device.name
    for tier in ("intra_node", "inter_node"):
        link = link_for_tier(tier, name, device.links)
        peaks[tier] = link.unidirectional_bytes_per_s
        models[tier] = link.link_model()
    return peaks, models


def _engine_analyse(
    topology: RankTopology, links: dict[str, Any]
) -> Callable[[str], Sequence[DecompositionLike]]:
    def analyse(path: str) -> Sequence[DecompositionLike]:
        from mfuscope.core.trace import AnalysisOptions, analyze_trace, read_trace

        options = AnalysisOptions(
            host_of_rank=dict(topology.host_of_rank) or None,
            axis_overrides=topology.axis_of_group_name,
            links=links,
        )
        steps: Sequence[DecompositionLike] = analyze_trace(read_trace(path), options).steps
        return steps

    return analyse


def _count_session() -> CountSession:
    from mfuscope.agent.flop_counting import StepFlopCount  # imports torch

    return StepFlopCount()


def build_runtime(
    config: AgentConfig,
    *,
    model: Any,
    mesh: Any,
    seams: Seams,
    health: HealthCounters,
    log: RateLimitedLog,
) -> Runtime:
    clock = seams.clock or time.monotonic
    topology = _topology(mesh, log)
    device = _device(model, topology, log)
    peak_flops, peak_source = _peak(config, device, log)
    link_peaks, link_models = _link_peaks(device)
    if topology.tp_spans_hosts:
        log.warning("tp-spans-hosts", "mfuscope: the tp group spans hosts (beyond NVLink)")
    if seams.timer is not None:
        timer: StepTimer = seams.timer
    elif device.use_cuda:
        import torch

        timer = DeviceEventStepTimer(lambda: torch.cuda.Event(enable_timing=True))
    else:
        timer = HostStepTimer()
    given = None
    if config.flops_per_step is not None:
        given = (config.flops_per_step, config.recompute_flops_per_step or 0.0)
    flops = FlopsTracker(
        given=given,
        new_session=_count_session if config.count_flops else None,
        log=log,
        model=model,
        max_recounts=config.max_flop_recounts,
    )
    analyser = WindowAnalyser(seams.analyse or _engine_analyse(topology, link_models))
    windows = WindowCoordinator(
        schedule=WindowSchedule(
            first_step=config.profile_first_step if config.profile else 1 << 62,
            every_steps=config.profile_every_steps,
            every_s=config.profile_every_s,
            max_overhead_ratio=config.profile_max_overhead_ratio,
        ),
        recorder=WindowRecorder(
            seams.profiler_factory or torch_profiler_factory(device.use_cuda),
            busy=torch_profiler_busy,
        ),
        analyser=analyser,
        window_steps=config.profile_steps,
        analysis_timeout_s=config.analysis_timeout_s,
        health=health,
        log=log,
        clock=clock,
    )
    unwrap = wrap_checkpoint() if config.wrap_checkpoint else (lambda: None)
    return Runtime(
        config=config,
        health=health,
        log=log,
        topology=topology,
        schema_topology=topology.to_schema(link_peaks),
        device_name=device.name,
        peak_flops=peak_flops,
        peak_source=peak_source,
        timer=timer,
        flops=flops,
        windows=windows,
        analyser=analyser,
        unwrap_checkpoint=unwrap,
    )
