"""Assembles an Agent's parts once at construction (imports torch; never at package import).

Peak precedence (docs/definitions.md#peak-flops): `peak_flops` given (source ``user``) > the
hardware table for the detected device and `dtype` (``spec``) > on CPU a matmul calibration,
measured once per machine and cached (``measured``, `mfuscope.agent.peak_cache`) > unknown
(reports carry ``peak_flops=None``, and the agent logs once how to pass it). Link specs per
group, each with its source: user options > detected links (NVML, sysfs) > datasheet > unknown
(`mfuscope.core.link_specs`).
"""

from __future__ import annotations

import contextlib
import functools
import os
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from mfuscope.agent._analysis_child import ChildAnalysis, analyse_in_process
from mfuscope.agent._announce import window_logger
from mfuscope.agent._health import HealthCounters, RateLimitedLog
from mfuscope.agent._hw_readers import nic_ids
from mfuscope.agent._kept_traces import TraceKeeper
from mfuscope.agent._known_waits import KnownWaits, install_dataloader
from mfuscope.agent._periodic import Periodic
from mfuscope.agent._profiler_windows import (
    Keep,
    WindowAnalyser,
    WindowRecorder,
    torch_profiler_busy,
    torch_profiler_factory,
)
from mfuscope.agent._recompute import wrap_checkpoint
from mfuscope.agent._report_assembly import BatchHeader
from mfuscope.agent._sinks import HttpSink, JsonlSink, Sink
from mfuscope.agent._step_flops import CountSession, FlopsTracker
from mfuscope.agent._step_recorder import StepRecorder
from mfuscope.agent._thread_clock import open_thread_clock
from mfuscope.agent._topology import (
    RankTopology,
    _env_int,
    build_topology,
    discover_gloo_workers,
    discover_topology,
    new_incarnation,
)
from mfuscope.agent._transport import RetryPolicy, Transport
from mfuscope.agent._window_coordinator import WindowCoordinator
from mfuscope.agent._window_schedule import (
    Agreement,
    AlignedSchedule,
    LocalAgreement,
    ScheduleParams,
)
from mfuscope.agent.collective_reader import CollectiveReader, build_collective_reader
from mfuscope.agent.config import AgentConfig
from mfuscope.agent.gpu_identity import GpuRef, cuda_gpu_ref, match_gpu, runs_in_mig_mode
from mfuscope.agent.hwcounters import HardwareSampler, build_hardware_sampler
from mfuscope.agent.step_timer import DeviceEventStepTimer, StepTimer, cuda_calls
from mfuscope.core.link_specs import LinkSpec, UserLinks, group_link_spec
from mfuscope.core.schema import StepReport, Topology
from mfuscope.core.step_report import DecompositionLike

if TYPE_CHECKING:
    from mfuscope.agent._agent import Seams

__all__ = ["Runtime", "build_runtime"]


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
    dtype: str
    timer: StepTimer | None  # device timer (GPU); on CPU the recorder's host clock
    recorder: StepRecorder
    flops: FlopsTracker
    windows: WindowCoordinator
    analyser: WindowAnalyser
    periodic: Periodic  # the agent's periodic thread: reports, collectives, counters, agreement
    unwrap_patches: Callable[[], None]  # restores what the agent patched in torch
    hardware: HardwareSampler | None = None
    collectives: CollectiveReader | None = None
    peak_note: str = ""  # where a measured peak comes from (its calibration and cache)
    known_waits: KnownWaits | None = None  # CPU timelines with the thread clock
    analysis_child: ChildAnalysis | None = None  # where windows are analysed (None: in-thread)

    def make_transports(
        self, encode: Callable[[Sequence[StepReport], str], bytes]
    ) -> list[Transport]:
        """One transport per sink; `encode(reports, sink)` makes each sink's batches."""
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
                _for_sink(encode, sink.describe()),
                self.health,
                self.log,
                max_queue_reports=self.config.max_queue_reports,
                max_batch_reports=self.config.max_batch_reports,
                flush_interval_s=self.config.flush_interval_s,
                retry=retry,
                # A live collector hears from the rank while no step completes (a blocked rank).
                heartbeat_s=self.config.status_interval_s if isinstance(sink, HttpSink) else None,
            )
            for sink in sinks
        ]

    def batch_header(self) -> BatchHeader:
        """The facts every wire batch of this rank repeats."""
        return BatchHeader(
            job=self.config.job,
            rank=self.topology.rank,
            world_size=self.topology.world_size,
            local_rank=self.topology.local_rank,
            host=self.topology.host,
            node=self.topology.node,
            device=self.device_name,
            peak_flops=self.peak_flops,
            peak_source=self.peak_source,
            topology=self.schema_topology,
            incarnation=self.topology.incarnation,
            dtype=self.dtype,
            run_key=self.config.run_key or "",
        )

    def shutdown(self) -> None:
        """Undo what construction installed; never raises."""
        with contextlib.suppress(Exception):
            self.unwrap_patches()
        with contextlib.suppress(Exception):
            self.flops.close()
        with contextlib.suppress(Exception):
            self.analyser.close(0.5)
        if self.analysis_child is not None:
            self.analysis_child.close()
        self.windows.close()
        if self.hardware is not None:
            self.hardware.stop()
        if self.collectives is not None:
            with contextlib.suppress(Exception):
                self.collectives.close(0.5)
        self.periodic.stop(1.0)


def _for_sink(
    encode: Callable[[Sequence[StepReport], str], bytes], name: str
) -> Callable[[Sequence[StepReport]], bytes]:
    def encode_for_sink(reports: Sequence[StepReport]) -> bytes:
        return encode(reports, name)

    return encode_for_sink


@dataclass(frozen=True)
class _Device:
    name: str
    use_cuda: bool
    links: Any  # mfuscope.core.interconnects.DetectedLinks | None
    index: int = 0  # the CUDA index of the rank's GPU (on CPU: the local rank)
    facts: Any = None  # mfuscope.agent.detect.HardwareInfo | None
    gpu: GpuRef | None = None  # which physical GPU that is (docs/agent.md#gpu-identity)
    nvml_index: int | None = None  # its index in NVML's numbering, None when not matched


def _topology(
    mesh: Any,
    log: RateLimitedLog,
    agree: tuple[Any, ...],
    node_name: str | None = None,
    axis_overrides: Mapping[str, str] | None = None,
    nics: tuple[str, ...] = (),
) -> RankTopology:
    try:
        topology = discover_topology(
            mesh, agree, node_name=node_name, axis_overrides=axis_overrides, nics=nics
        )
        if topology.rank == 0:  # the same on every rank: said once, by rank 0
            for problem in topology.placement_problems:
                log.warning(f"placement-{problem[:40]}", "mfuscope: node placement: %s", problem)
        return topology
    except Exception as exc:
        log.warning("topology", "mfuscope: topology discovery failed (%r); tiers unknown", exc)
        import socket

        import torch.distributed as dist

        initialised = dist.is_available() and dist.is_initialized()
        rank = dist.get_rank() if initialised else _env_int("RANK", 0)
        world = dist.get_world_size() if initialised else _env_int("WORLD_SIZE", 1)
        hosts: list[str | None] = [None] * max(world, rank + 1)
        hosts[rank] = socket.gethostname()
        local_rank = _env_int("LOCAL_RANK", 0)
        return build_topology(
            rank=rank,
            local_rank=local_rank,
            hosts=hosts,
            groups=(),
            incarnation=new_incarnation(),
        )


def _device(model: Any, topology: RankTopology, log: RateLimitedLog, seams: Seams) -> _Device:
    """The device this rank trains on, and its links as detection (NVML, sysfs) sees them.

    The name comes from torch for the current CUDA device (authoritative for the device in use);
    NVML supplies NVLink / PCIe / NIC facts for the NVML device with that CUDA device's UUID or
    PCI bus id (`gpu_identity.match_gpu`: never the CUDA index while CUDA_VISIBLE_DEVICES is set).
    """
    import torch

    use_cuda = torch.cuda.is_available()
    if model is not None and hasattr(model, "parameters"):
        first = next(iter(model.parameters()), None)
        if first is not None:
            use_cuda = first.device.type == "cuda"
    index = torch.cuda.current_device() if use_cuda else topology.local_rank
    name = torch.cuda.get_device_name(index) if use_cuda else "cpu"
    # Tests: a fake NVML on a CPU-only machine stands in for the GPU of CUDA index `index`.
    gpu = cuda_gpu_ref(index) if use_cuda or seams.nvml is not None else None
    links = facts = nvml_index = None
    try:
        from mfuscope.agent.detect import detect_hardware

        facts = detect_hardware(nvml=seams.nvml, sysfs_root=seams.sysfs_root or "/")
        matched = match_gpu(facts.gpus, gpu)
        nvml_index = matched.index if matched is not None else None
        if gpu is not None and facts.gpus and matched is None:
            log.info("detect-gpu", "mfuscope: no NVML GPU matches CUDA device %s (%s)", index, gpu)
        links = facts.links_for(-1 if nvml_index is None else nvml_index)
        for reason in facts.reasons:
            log.info(f"detect-{reason[:40]}", "mfuscope: hardware detection: %s", reason)
    except Exception as exc:  # detection must never stop the job
        log.info("detect", "mfuscope: hardware detection unavailable (%r)", exc)
    return _Device(
        name=name,
        use_cuda=use_cuda,
        links=links,
        index=index,
        facts=facts,
        gpu=gpu,
        nvml_index=nvml_index,
    )


def _hardware(
    config: AgentConfig,
    device: _Device,
    topology: RankTopology,
    seams: Seams,
    log: RateLimitedLog,
    *,
    node_nics: Mapping[str, str],
) -> HardwareSampler | None:
    """The rank's counter sampler: its own GPU, and of the node's NICs (`node_nics`, device name
    -> id, what went into the node claim) those it samples for its node."""
    if not config.hardware_counters:
        return None
    from mfuscope.agent.detect import link_peaks

    nics = topology.nics_sampled(node_nics)
    return build_hardware_sampler(
        gpu=device.gpu,
        sample_nics=nics,
        log=log,
        link_peaks=link_peaks(
            device.facts, -1 if device.nvml_index is None else device.nvml_index, nics=nics
        ),
        nvml=seams.nvml,
        sysfs_root=seams.sysfs_root or "/",
        clock=seams.clock or time.monotonic,
        interval_s=config.hardware_interval_s,
    )


def _mig_enabled(device: _Device) -> bool:
    """Whether NVML reports MIG mode on for this rank's GPU (then the peak is a slice's), the
    GPU found by identity (docs/agent.md#gpu-identity), never by its CUDA index."""
    return runs_in_mig_mode(getattr(device.facts, "gpus", ()) or (), device.gpu)


def _dtype(config: AgentConfig, device: _Device) -> str:
    """The training dtype: the user's, else bf16 on a GPU and fp32 on a CPU."""
    return config.dtype or ("bf16" if device.use_cuda else "fp32")


def _peak(config: AgentConfig, device: _Device, log: RateLimitedLog) -> tuple[float | None, str]:
    """(peak FLOP/s, its source), for a launch of its own (`_peak_with_note`)."""
    peak, source, _ = _peak_with_note(config, device, log, "")
    return peak, source


def _peak_with_note(
    config: AgentConfig, device: _Device, log: RateLimitedLog, incarnation: str
) -> tuple[float | None, str, str]:
    """(peak FLOP/s, its source, a note on a measured one). The ranks of one launch on one host
    share a cached calibration (`incarnation` keeps a requested recalibration to one per
    launch)."""
    from mfuscope.core.hardware import resolve_peak

    dtype = _dtype(config, device)
    lookup = resolve_peak(device.name, dtype, config.peak_flops, mig=_mig_enabled(device))
    if lookup.peak_flops is not None:
        return lookup.peak_flops, lookup.source, ""
    if not device.use_cuda and config.calibrate_cpu_peak:
        try:
            from mfuscope.agent.calibrate import cached_cpu_peak

            found = cached_cpu_peak(
                dtype,
                cache_dir=config.cpu_peak_cache_dir,
                recalibrate=config.recalibrate_cpu_peak,
                incarnation=incarnation,
            )
            if found.peak_flops >= 1.0:
                return found.peak_flops, "measured", found.describe()
        except Exception as exc:
            log.warning("calibrate", "mfuscope: CPU peak calibration failed: %r", exc)
    log.warning(
        "peak-unknown", "mfuscope: peak FLOP/s unknown, MFU not computed: %s", lookup.message
    )
    return None, "unknown", ""


def _group_link_specs(
    config: AgentConfig, device: _Device, topology: RankTopology
) -> dict[str, LinkSpec]:
    """Group name -> the spec its collectives are compared with, with its source: the rank's own
    link inside the node, the NICs the group's ranks on this node drive across nodes
    (`mfuscope.core.link_specs`); unknown on a CPU run unless the user states the links."""
    user = UserLinks(
        intra_node_bytes_per_s=config.intra_node_link_bytes_per_s,
        nic_bytes_per_s=config.nic_bytes_per_s,
        nic_count=config.nic_count,
    )
    name = None if device.name == "cpu" else device.name
    return {
        g.name: group_link_spec(
            g.tier,
            name,
            ranks_on_node=topology.ranks_on_own_node(g),
            detected=device.links,
            user=user,
        )
        for g in topology.groups
    }


def _engine_analyse(
    topology: RankTopology,
    device: _Device,
    workers: Callable[[str], Mapping[int, str] | None],
    child: ChildAnalysis | None,
) -> Callable[[str], Sequence[DecompositionLike]]:
    """The engine on a window's trace, with this rank's options (worked out here: the gloo
    worker threads are this process's), in `child` when given (`_analysis_child`)."""

    def analyse(path: str) -> Sequence[DecompositionLike]:
        from mfuscope.core.trace.options import analysis_options

        options = analysis_options(
            device=None if device.name == "cpu" else device.name,
            detected=device.links,
            # Tiers compare node identities, not host names (docs/definitions.md#node-identity).
            host_of_rank=dict(topology.node_of_rank),
            axis_overrides=topology.axis_of_group_name,
            gloo_worker_groups=workers(path),
        )
        steps: Sequence[DecompositionLike] = (
            analyse_in_process(path, options) if child is None else child(path, options)
        )
        return steps

    return analyse


def _schedule_values(config: AgentConfig) -> tuple[bool, int, int, int, float, int, float]:
    """This rank's window-schedule options, in the order `_window_schedule` reads rank 0's."""
    return (
        config.profile,
        config.first_step,
        config.profile_first_step,
        config.profile_every_steps,
        config.profile_every_s,
        config.profile_steps,
        config.profile_max_overhead_ratio,
    )


def _window_schedule(
    config: AgentConfig,
    topology: RankTopology,
    own: tuple[bool, int, int, int, float, int, float],
    log: RateLimitedLog,
    periodic: Periodic,
) -> AlignedSchedule:
    """The schedule every rank follows: rank 0's options (handed out by the start-up gather),
    decisions taken by rank 0 and read by the others from the job's store (docs/agent.md,
    "Profiled windows") on `periodic`'s thread. `own`: this rank's `_schedule_values`."""
    agreed = topology.agreed if topology.agreed and len(topology.agreed) == len(own) else own
    profile, first_step, first_offset, every_steps, every_s, window_steps, ratio = agreed
    if agreed != own:
        log.info(
            "window-options",
            "mfuscope: this rank's profiling options or first_step differ from rank 0's; "
            "windows follow rank 0's",
        )
    params = ScheduleParams(
        # Counted from the first step of this launch: a resumed job warms up again too.
        first_window_step=first_step + first_offset,
        every_steps=every_steps,
        every_s=every_s,
        window_steps=window_steps,
        max_overhead_ratio=ratio,
    )
    agreement: Agreement = LocalAgreement()
    members = 1  # ranks marking windows done under this agreement
    if topology.agreed is not None and topology.world_size > 1:
        try:
            from mfuscope.agent._store_agreement import default_store_agreement

            shared = default_store_agreement(topology.incarnation, periodic)
            if shared is not None:
                agreement, members = shared, topology.world_size
        except Exception as exc:
            log.warning(
                "window-store",
                "mfuscope: no store to agree profiled windows on (%r); this rank picks alone",
                exc,
            )
    # A rank numbering its steps from elsewhere than rank 0 still profiles the same steps.
    return AlignedSchedule(
        params,
        agreement,
        step_offset=config.first_step - first_step,
        members=members,
        enabled=bool(profile),
        decider=members == 1 or topology.rank == 0,  # alone, a rank decides for itself
        on_missed=lambda why: log.info("window-late", "mfuscope: %s", why),
    )


def _count_session() -> CountSession:
    from mfuscope.agent._counted_flops import StepFlopCount  # imports torch

    return StepFlopCount()


def _dispatch_mode_stack() -> object:
    from mfuscope.agent._counted_flops import dispatch_mode_stack  # imports torch

    return dispatch_mode_stack()


def _keeper(
    config: AgentConfig, topology: RankTopology, workers: Callable[[str], Mapping[int, str] | None]
) -> Keep | None:
    """Where window traces are kept (`keep_traces`), None when they are not."""
    if config.keep_traces < 1:
        return None
    directory = config.keep_traces_dir or os.path.join(tempfile.gettempdir(), "mfuscope-traces")
    keeper = TraceKeeper(
        directory, config.keep_traces, config.keep_traces_max_bytes, rank=topology.rank
    )

    def keep(path: str, steps: tuple[int, ...]) -> Any:
        # The trace engine's package is imported on the analyser thread, not at agent start.
        from mfuscope.core.trace.worker_groups import TRACE_KEY, trace_fields

        # The same gloo worker-thread map the analysis uses, so the kept trace reads the same.
        mapped = workers(path)
        return keeper.keep_trace(path, steps, {TRACE_KEY: trace_fields(mapped)} if mapped else None)

    return keep


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
    schedule_values = _schedule_values(config)
    # The NICs this rank can read go into its node claim: one rank per NIC and node samples it.
    node_nics = nic_ids(seams.sysfs_root or "/") if config.hardware_counters else {}
    topology = _topology(
        mesh,
        log,
        schedule_values,
        config.node_name,
        config.axis_overrides,
        tuple(node_nics.values()),
    )
    device = _device(model, topology, log, seams)
    peak_flops, peak_source, peak_note = _peak_with_note(config, device, log, topology.incarnation)
    group_specs = _group_link_specs(config, device, topology)
    if topology.tp_spans_hosts:
        log.warning("tp-spans-hosts", "mfuscope: the tp group spans hosts (beyond NVLink)")
    timer: DeviceEventStepTimer | None = None
    if seams.timer is not None:
        timer = seams.timer
    elif device.use_cuda:
        timer = DeviceEventStepTimer(
            cuda_calls(device.index), close_wait_s=min(config.close_timeout_s * 0.25, 2.0)
        )
    # On the training thread (it makes the agent): the schedstat file names the opening thread.
    thread_clock = None
    if timer is None and config.thread_clock:
        thread_clock = (seams.thread_clock or open_thread_clock)()
    recorder = StepRecorder(
        first_step=config.first_step,
        timer=timer,
        health=health,
        log=log,
        thread_clock=thread_clock,
    )
    # The blocked time the agent can name (a data loader's fetch, its own profiler): left out of
    # the blocked time carried steps take their exposed communication from.
    known_waits = unwrap_dataloader = None
    if thread_clock is not None:
        known_waits = KnownWaits(thread_clock.read, lambda: recorder.begun, config.first_step)
        unwrap_dataloader = install_dataloader(known_waits)
    given = None
    if config.flops_per_step is not None:
        given = (config.flops_per_step, config.recompute_flops_per_step or 0.0)
    # One /proc scan per profiled trace, shared by the kept copy and the analysis (the analyser
    # thread keeps a trace, then analyses it).
    workers = functools.lru_cache(maxsize=1)(lambda path: discover_gloo_workers())
    # The analysis runs in a child process: on the analyser thread it held the GIL for hundreds
    # of milliseconds after each window (`_analysis_child`). Its CPU time counts in the window's
    # cost as the thread's own did.
    child = None
    if seams.analyse is None:
        child = ChildAnalysis(
            on_fallback=lambda why: log.warning(
                "analysis-child",
                "mfuscope: window analysis runs on the agent's thread from here on (its child "
                "process: %s); it holds the GIL there",
                why,
            )
        )
    analyser = WindowAnalyser(
        seams.analyse or _engine_analyse(topology, device, workers, child),
        keep=_keeper(config, topology, workers),
        on_analysed=window_logger(log.logger, topology.rank),
        thread_time=time.thread_time if child is None else lambda: time.thread_time() + child.cpu_s,
    )
    periodic = Periodic(log, clock=time.monotonic)
    schedule = _window_schedule(config, topology, schedule_values, log, periodic)
    windows = WindowCoordinator(
        schedule=schedule,
        recorder=WindowRecorder(
            seams.profiler_factory or torch_profiler_factory(device.use_cuda),
            busy=torch_profiler_busy,
        ),
        analyser=analyser,
        analysis_timeout_s=config.analysis_timeout_s,
        health=health,
        log=log,
        clock=clock,
        record=config.profile,
        known_waits=known_waits,
    )
    flops = FlopsTracker(
        given=given,
        new_session=_count_session if config.count_flops else None,
        log=log,
        model=model,
        max_recounts=config.max_flop_recounts,
        mode_stack=_dispatch_mode_stack,
        may_count_now=lambda: not windows.recording,  # never count inside a window
        match=recorder,  # the recorder checks the steady shapes on its fast path
    )
    recorder.bind(flops, windows)
    unwrap_checkpoint = wrap_checkpoint() if config.wrap_checkpoint else (lambda: None)

    def unwrap() -> None:
        unwrap_checkpoint()
        if unwrap_dataloader is not None:
            unwrap_dataloader()

    hardware = _hardware(config, device, topology, seams, log, node_nics=node_nics)
    if hardware is not None:
        hardware.start(periodic)
    collectives = build_collective_reader(config, topology, log, seams.collective_sources)
    if collectives is not None:
        collectives.start(periodic)
    return Runtime(
        config=config,
        health=health,
        log=log,
        topology=topology,
        schema_topology=topology.to_schema(group_specs=group_specs),
        device_name=device.name,
        peak_flops=peak_flops,
        peak_source=peak_source,
        dtype=_dtype(config, device),
        timer=timer,
        recorder=recorder,
        flops=flops,
        windows=windows,
        analyser=analyser,
        periodic=periodic,
        unwrap_patches=unwrap,
        hardware=hardware,
        collectives=collectives,
        peak_note=peak_note,
        known_waits=known_waits,
        analysis_child=child,
    )
