"""Agent configuration: one frozen dataclass, validated on construction.

Precedence (`mfuscope.core.settings`): an explicit argument, else the `MFUSCOPE_<FIELD>`
environment variable (field name upper-cased, e.g. `MFUSCOPE_COLLECTOR_URL`), else a value a
framework integration derives, else the default. The environment lets operators retune or
redirect an instrumented job without code changes, whoever constructs the agent.
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from mfuscope.core.errors import ConfigError
from mfuscope.core.run_key import check_run_key
from mfuscope.core.settings import parse_setting_text, pick_settings

__all__ = ["OPTION_HELP", "AgentConfig"]


@dataclass(frozen=True)
class AgentConfig:
    """Everything the agent can be told. Units are in the names; ratios are 0..1.

    Sampling: a profiled window of `profile_steps` steps first at step `profile_first_step`, then
    whenever `profile_every_steps` steps or `profile_every_s` seconds have passed since the last
    one, whichever comes first, but never sooner than the largest measured cost of a recent window
    on any rank divided by `profile_max_overhead_ratio` (so the amortised profiling cost stays
    under that ratio). Rank 0's sampling options apply on every rank, and the window starts are
    agreed, so every rank profiles the same steps (`window_schedule`, docs/agent.md).

    Kept traces: with `keep_traces` = N > 0, the Kineto traces of this rank's last N profiled
    windows are kept gzipped in `keep_traces_dir` (None: ``mfuscope-traces`` in the system temp
    directory), at most `keep_traces_max_bytes` together (docs/agent.md).
    """

    job: str
    collector_url: str | None = None
    # The number of this process's first step: a job resuming from a checkpoint passes the
    # checkpoint's step, so the steps it runs again are reported (and counted) as redone.
    first_step: int = 0
    jsonl_path: str | None = None  # `{rank}` in the path is replaced by the rank
    token: str | None = None  # bearer token for the collector
    # FLOPs per step of this rank; None: counted once with FlopCounterMode on the first step.
    flops_per_step: float | None = None
    recompute_flops_per_step: float | None = None
    count_flops: bool = True
    max_flop_recounts: int = 8  # distinct input shapes counted before giving up recounting
    peak_flops: float | None = None  # dense peak FLOP/s of this rank's device
    dtype: str | None = None  # training dtype for the peak lookup; None: bf16 on GPU, fp32 on CPU
    calibrate_cpu_peak: bool = True
    # The calibrated CPU peak is measured once per machine and cached (mfuscope.agent.peak_cache):
    # `recalibrate_cpu_peak` measures it again for this launch; the cache lives in
    # `cpu_peak_cache_dir` (None: $XDG_CACHE_HOME/mfuscope, else ~/.cache/mfuscope).
    recalibrate_cpu_peak: bool = False
    cpu_peak_cache_dir: str | None = None
    # Link facts that override detection and datasheets (docs/definitions.md#link-specs), bytes/s
    # per direction: the GPU's intra-node link; one NIC port; the NIC ports a node has for
    # training traffic (None: one per rank, the rail-optimised layout).
    intra_node_link_bytes_per_s: float | None = None
    nic_bytes_per_s: float | None = None
    nic_count: int | None = None
    profile: bool = True
    profile_first_step: int = 10
    profile_every_steps: int = 1000
    profile_every_s: float = 300.0
    profile_steps: int = 3
    profile_max_overhead_ratio: float = 0.005
    # On CPU timelines, read the training thread's clock at each step's start (one /proc read):
    # the steps between windows then carry their own exposed communication
    # (docs/definitions.md#carried-breakdowns).
    thread_clock: bool = True
    keep_traces: int = 0
    keep_traces_dir: str | None = None
    keep_traces_max_bytes: int = 1 << 30
    # Process-group name, description or DeviceMesh dim name -> axis; wins over the built-in
    # names (docs/definitions.md#axes). Environment: ``name=axis,name=axis``.
    axis_overrides: Mapping[str, str] | None = None
    wrap_checkpoint: bool = False
    flush_interval_s: float = 5.0
    max_batch_reports: int = 256
    max_queue_reports: int = 10_000
    request_timeout_s: float = 5.0
    max_send_attempts: int = 0  # 0: retry while the report buffer has room
    retry_base_s: float = 0.5
    retry_max_s: float = 10.0
    close_timeout_s: float = 10.0
    analysis_timeout_s: float = 120.0
    log_interval_s: float = 60.0
    # GPU (NVML) and NIC (sysfs) counters sampled every `hardware_interval_s` on the agent's
    # periodic thread.
    hardware_counters: bool = True
    hardware_interval_s: float = 1.0
    # Always-on collective records from PyTorch's flight recorder, read every
    # `collective_read_interval_s` on the agent's periodic thread (docs/agent.md, "Collective
    # records"); on NCCL, `collective_timing` also turns on the recorder's durations. While no
    # step completes the agent still sends its status every `status_interval_s` (a blocked rank).
    collective_records: bool = True
    collective_timing: bool = True
    collective_read_interval_s: float = 5.0
    status_interval_s: float = 10.0
    # The node this rank runs on, for tiers (docs/definitions.md#node-identity); in Kubernetes
    # set MFUSCOPE_NODE_NAME from the downward API's spec.nodeName. None: NODE_NAME, else the
    # kernel's boot id, else the host name.
    node_name: str | None = None
    # Which runs are the same workload (docs/compare.md): None, the fingerprint of this rank's
    # FLOPs per step, world size, layout, device and dtype (`mfuscope.core.run_key`).
    run_key: str | None = None
    enabled: bool = True

    def __post_init__(self) -> None:
        if not isinstance(self.job, str) or not self.job or len(self.job) > 256:
            raise ConfigError("job", "a non-empty name of at most 256 characters is required")
        try:  # a Latin-1 environment value decodes to lone surrogates: no collector accepts it
            self.job.encode("utf-8")
        except UnicodeEncodeError:
            raise ConfigError(
                "job",
                f"{self.job!r} is not valid UTF-8 (set it in UTF-8, e.g. from a UTF-8 locale)",
            ) from None
        for name in ("flops_per_step", "recompute_flops_per_step"):
            value = getattr(self, name)
            if value is not None and not (math.isfinite(value) and value >= 0):
                raise ConfigError(name, f"must be a finite number >= 0, got {value!r}")
        if self.peak_flops is not None and not (
            math.isfinite(self.peak_flops) and self.peak_flops >= 1.0
        ):
            raise ConfigError("peak_flops", f"must be a finite FLOP/s >= 1, got {self.peak_flops}")
        for name in ("intra_node_link_bytes_per_s", "nic_bytes_per_s"):
            value = getattr(self, name)
            if value is not None and not (math.isfinite(value) and value > 0):
                raise ConfigError(name, f"must be a finite bytes/s > 0, got {value!r}")
        if self.nic_count is not None and self.nic_count < 1:
            raise ConfigError("nic_count", f"must be >= 1, got {self.nic_count}")
        if self.collector_url is not None and not self.collector_url.startswith(
            ("http://", "https://")
        ):
            raise ConfigError(
                "collector_url", f"must start with http:// or https://, got {self.collector_url!r}"
            )
        for name in (
            "profile_steps",
            "max_batch_reports",
            "max_queue_reports",
            "profile_every_steps",
        ):
            if getattr(self, name) < 1:
                raise ConfigError(name, f"must be >= 1, got {getattr(self, name)}")
        if self.keep_traces_max_bytes < 1:
            raise ConfigError(
                "keep_traces_max_bytes", f"must be >= 1 byte, got {self.keep_traces_max_bytes}"
            )
        for name in (
            "first_step",
            "profile_first_step",
            "max_flop_recounts",
            "keep_traces",
            "max_send_attempts",
        ):
            if getattr(self, name) < 0:
                raise ConfigError(name, f"must be >= 0, got {getattr(self, name)}")
        for name in (
            "profile_every_s",
            "flush_interval_s",
            "request_timeout_s",
            "retry_base_s",
            "retry_max_s",
            "close_timeout_s",
            "analysis_timeout_s",
            "log_interval_s",
        ):
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= 0):
                raise ConfigError(name, f"must be a finite number of seconds >= 0, got {value}")
        if not 0 < self.profile_max_overhead_ratio <= 1:
            raise ConfigError(
                "profile_max_overhead_ratio",
                f"must be in (0, 1], got {self.profile_max_overhead_ratio}",
            )
        if self.axis_overrides is not None and (
            not isinstance(self.axis_overrides, Mapping)
            or not all(
                isinstance(k, str) and k and isinstance(v, str) and v
                for k, v in self.axis_overrides.items()
            )
        ):
            raise ConfigError("axis_overrides", "must map non-empty names to non-empty axis names")
        if self.request_timeout_s <= 0:
            raise ConfigError("request_timeout_s", "must be > 0")
        if self.node_name is not None and len(self.node_name) > 256:
            raise ConfigError("node_name", "at most 256 characters")
        if self.run_key is not None:
            try:
                check_run_key(self.run_key)
            except ValueError as exc:
                raise ConfigError("run_key", str(exc)) from None
        if not (math.isfinite(self.hardware_interval_s) and self.hardware_interval_s >= 0.05):
            raise ConfigError(
                "hardware_interval_s", f"must be >= 0.05 s, got {self.hardware_interval_s}"
            )
        for name, low, high in (
            ("collective_read_interval_s", 0.05, 60.0),
            ("status_interval_s", 1.0, 300.0),
        ):
            value = getattr(self, name)
            if not (math.isfinite(value) and low <= value <= high):
                raise ConfigError(name, f"must be between {low} and {high} s, got {value}")

    @classmethod
    def resolve(
        cls,
        arguments: Mapping[str, object],
        env: Mapping[str, str] | None = None,
        derived: Mapping[str, object] | None = None,
    ) -> AgentConfig:
        """Build a config: `arguments` that are not None win, then `MFUSCOPE_*` in `env`
        (default `os.environ`), then the `derived` values of an integration, then the defaults.

        Raises `ConfigError` for an unknown option name or a bad value (naming its source).
        """
        environ = os.environ if env is None else env
        fields = {f.name: f for f in dataclasses.fields(cls)}
        unknown = sorted((set(arguments) | set(derived or {})) - set(fields))
        if unknown:
            raise ConfigError(unknown[0], f"unknown option; known: {', '.join(sorted(fields))}")
        picked = pick_settings(fields, arguments, environ, derived)
        values: dict[str, Any] = {
            name: _coerce(name, fields[name].type, setting.value, setting.source)
            for name, setting in picked.items()
        }
        if "job" not in values:
            raise ConfigError("job", "required: pass job=... or set MFUSCOPE_JOB")
        try:
            return cls(**values)
        except ConfigError as exc:  # name where the bad value came from
            source = picked[exc.field].source if exc.field in picked else exc.source
            if source == exc.source:
                raise
            raise ConfigError(exc.field, exc.message, source) from None

    @classmethod
    def option(
        cls, name: str, arguments: Mapping[str, object], env: Mapping[str, str] | None = None
    ) -> Any:
        """What the user set option `name` to, by argument or `MFUSCOPE_*` in `env` (default
        `os.environ`), else its default: for an integration that derives a value only when the
        user's options call for it. Raises `ConfigError` for an unknown name or a bad value."""
        fields = {f.name: f for f in dataclasses.fields(cls)}
        if name not in fields:
            raise ConfigError(name, f"unknown option; known: {', '.join(sorted(fields))}")
        environ = os.environ if env is None else env
        picked = pick_settings([name], arguments, environ).get(name)
        if picked is None:
            return fields[name].default
        return _coerce(name, fields[name].type, picked.value, picked.source)


# What each option means, one entry per field (a test checks): the reference table
# docs/reference/agent-options.md is generated from the fields and this (docs/reference/build.py).
OPTION_HELP: dict[str, str] = {
    "job": "job name (required)",
    "collector_url": "`http(s)://host:port`; batches go to `POST /v1/reports`",
    "first_step": (
        "number of this process's first step; a job resuming from a checkpoint passes the "
        "checkpoint's step, so the steps it runs again count as redone (docs/agent.md, 'Restarts')"
    ),
    "jsonl_path": "append one batch (wire format) per line; `{rank}` is replaced",
    "token": "bearer token for the collector",
    "flops_per_step": "this rank's model FLOPs per step; None: counted",
    "recompute_flops_per_step": "with `flops_per_step`: recompute FLOPs per step (else 0)",
    "count_flops": "count FLOPs with `FlopCounterMode` when not given",
    "max_flop_recounts": (
        "distinct input-shape sets counted, each on its own step, before reusing the latest count"
    ),
    "peak_flops": "dense peak FLOP/s of this rank's device (source `user`)",
    "dtype": "training dtype for the peak lookup; None: `bf16` on GPU, `fp32` on CPU",
    "calibrate_cpu_peak": (
        "on CPU, use this machine's calibrated matmul peak (source `measured`; measured once, 2 s,"
        " then cached: docs/agent.md#cpu-peak)"
    ),
    "recalibrate_cpu_peak": (
        "measure the CPU peak again for this launch (every rank of the launch then uses the new"
        " figure)"
    ),
    "cpu_peak_cache_dir": (
        "where the calibrated CPU peak is kept; None: `$XDG_CACHE_HOME/mfuscope`, else"
        " `~/.cache/mfuscope`"
    ),
    "intra_node_link_bytes_per_s": (
        "the GPU's intra-node link rate per direction, bytes/s (spec source `user`; "
        "docs/definitions.md#link-specs)"
    ),
    "nic_bytes_per_s": (
        "one NIC port's rate per direction, bytes/s: inter-node specs become min(ranks on the "
        "node, NICs) x this (source `user`)"
    ),
    "nic_count": (
        "NIC ports a node has for training traffic; None: one per rank (rail-optimised), or the"
        " detected ports"
    ),
    "profile": "take sampled profiler windows",
    "profile_first_step": "first window this many steps after `first_step`",
    "profile_every_steps": "then a window every N steps ...",
    "profile_every_s": "... or every T seconds, whichever comes first ...",
    "profile_steps": "steps per window",
    "profile_max_overhead_ratio": (
        "... but never sooner than (largest measured window cost of any rank) / ratio"
    ),
    "thread_clock": (
        "on CPU timelines, read the training thread's CPU time and run delay at each step's start"
        " (one read of `/proc/thread-self/schedstat`), and around each `DataLoader` fetch (two"
        " reads; the loader's iterator is wrapped while the agent runs): the steps between windows"
        " carry their own exposed communication, and a late loader's wait as idle"
        " (docs/definitions.md#carried-breakdowns); false: they carry the window's share"
    ),
    "keep_traces": (
        "keep the Kineto traces of this rank's last N profiled windows (0: none; "
        "docs/agent.md, 'Kept traces')"
    ),
    "keep_traces_dir": "where; None: `mfuscope-traces` in the system temp directory",
    "keep_traces_max_bytes": (
        "the kept traces of a rank together stay under this (the newest is always kept)"
    ),
    "axis_overrides": (
        'process-group name, description or DeviceMesh dim name -> axis, e.g. `{"MY_TP_GROUP": '
        '"tp"}`; in the environment `MFUSCOPE_AXIS_OVERRIDES=MY_TP_GROUP=tp,3=dp`; wins over '
        "the built-in names (docs/definitions.md#axes)"
    ),
    "wrap_checkpoint": (
        "patch `torch.utils.checkpoint.checkpoint` so every checkpointed region's recomputation"
        " is marked and counted apart, without passing `context_fn`"
    ),
    "flush_interval_s": "longest a report waits before its batch is sent",
    "max_batch_reports": "reports per batch",
    "max_queue_reports": (
        "buffer bound, the batch being retried included; when full the oldest reports are "
        "dropped (counted). Smaller than `max_batch_reports` logs a warning at start: an outage"
        " of one flush interval would then drop reports"
    ),
    "request_timeout_s": (
        "deadline of one whole HTTP exchange (connect, send, response), not of each read"
    ),
    "max_send_attempts": (
        "per batch, then it is dropped (counted); 0: keep retrying while the report buffer has "
        "room (only a full buffer drops, oldest first)"
    ),
    "retry_base_s": (
        "first retry backoff: `min(retry_max_s, retry_base_s * 2^(attempt-1))`; a collector's "
        "`Retry-After` lengthens it, up to `retry_max_s`"
    ),
    "retry_max_s": "longest retry backoff (see `retry_base_s`)",
    "close_timeout_s": "how long `close()` may take in total",
    "analysis_timeout_s": "a window analysis slower than this is given up (counted)",
    "log_interval_s": "each kind of warning is logged at most once per interval",
    "hardware_counters": (
        "sample GPU (NVML) and NIC (sysfs) counters on the agent's periodic thread"
    ),
    "hardware_interval_s": "seconds between hardware-counter samples (at least 0.05)",
    "collective_records": (
        "read PyTorch's flight recorder on the agent's periodic thread: every collective of "
        "every step counted, hangs attributed (docs/agent.md#collective-records); "
        "`MFUSCOPE_COLLECTIVE_RECORDS=0` also keeps `import mfuscope.agent` from asking for the"
        " recorder"
    ),
    "collective_timing": (
        "on NCCL, turn on the recorder's collective durations for the process groups that exist"
        " (docs/agent.md#collective-records); the steps between windows take their exposed"
        " communication from them (docs/definitions.md#carried-gpu-steps)"
    ),
    "collective_read_interval_s": (
        "longest pause between two reads of the recorder (0.05-60); shorter when collectives "
        "arrive fast enough to fill a quarter of the ring in that time. Each read copies the "
        "whole ring (CPU, not the GIL): fewer reads cost less"
    ),
    "status_interval_s": (
        "while nothing else is sent, a status batch (no step reports) goes to the collector "
        "this often (1-300): a rank blocked in a collective keeps reporting what it waits in"
    ),
    "node_name": (
        "the node this rank runs on, for tiers; in Kubernetes `MFUSCOPE_NODE_NAME` from "
        "`spec.nodeName`. None: `NODE_NAME`, else the kernel's boot id, else the host name "
        "(docs/definitions.md#node-identity)"
    ),
    "run_key": (
        "which runs are the same workload, for the live baseline across runs "
        "(docs/compare.md#the-run-key). None: a fingerprint of this rank's model FLOPs per "
        "step, world size, layout, device and dtype, sent once the FLOPs are known"
    ),
    "enabled": "`MFUSCOPE_ENABLED=0` turns the agent into a no-op",
}


def _coerce(name: str, type_name: object, raw: object, source: str) -> Any:
    """Convert `raw` to the field's annotated type (annotations are strings here)."""
    text = str(type_name)
    try:
        if isinstance(raw, str):
            return parse_setting_text(raw, text)
        if text.startswith("bool") and not isinstance(raw, bool):
            raise ValueError(f"expected a boolean, got {raw!r}")
        if text.startswith("int") and (isinstance(raw, bool) or not isinstance(raw, int)):
            raise ValueError(f"expected an integer, got {raw!r}")
        if text.startswith("float"):
            if isinstance(raw, bool) or not isinstance(raw, (int, float)):
                raise ValueError(f"expected a number, got {raw!r}")
            return float(raw)
        if text.startswith("str") and isinstance(raw, os.PathLike):
            return os.fspath(raw)
        if text.startswith("str") and not isinstance(raw, str):
            raise ValueError(f"expected a string, got {raw!r}")
        return raw
    except ValueError as exc:
        raise ConfigError(name, str(exc), source) from None
