"""Public data model of the step decomposition: options in, per-rank results out.

All times are seconds, sizes bytes, rates bytes/s or FLOP/s, ratios 0..1 (docs/definitions.md).
The records are frozen msgspec Structs (copy with `msgspec.structs.replace`), not dataclasses:
a Struct class is made in ~0.02 ms, a frozen dataclass in ~1 ms, at every `mfuscope analyze`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import msgspec
from mfuscope.core.bandwidth import LinkModel
from mfuscope.core.trace._trace_model import (
    WINDOW_ANNOTATION_PREFIX,
    WINDOW_PROFILER_STEP,
    WINDOW_RANGE,
    WINDOW_WHOLE_TRACE,
    WindowRequest,
)

__all__ = [
    "WINDOW_ANNOTATION_PREFIX",
    "WINDOW_PROFILER_STEP",
    "WINDOW_RANGE",
    "WINDOW_WHOLE_TRACE",
    "AnalysisOptions",
    "CollectiveRecord",
    "CommSpan",
    "ExposedComm",
    "KernelClassSeconds",
    "RankAnalysis",
    "StepDecomposition",
]


def _check_optional_float(name: str, value: float | None, *, positive: bool) -> None:
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{name} must be a number or None, got {type(value).__name__}")
    if not math.isfinite(value):
        raise ValueError(f"{name} must be finite, got {value}")
    if positive and value <= 0:
        raise ValueError(f"{name} must be > 0, got {value}")
    if value < 0:
        raise ValueError(f"{name} must be >= 0, got {value}")


class AnalysisOptions(msgspec.Struct, frozen=True):
    """How to read a trace: topology facts and the FLOPs needed for MFU/HFU.

    - `gpus_per_node`: ranks per host used to tell intra- from inter-node groups
      (rank r lives on host ``r // gpus_per_node``). None: 8 for GPU traces; for CPU-only (gloo)
      traces all ranks are taken to share one host.
    - `host_of_rank`: global rank -> host name; authoritative when given (the live agent knows it).
    - `axis_overrides`: process-group name or description -> axis name (e.g. ``{"3": "tp"}``).
    - `model_flops_per_step` / `recompute_flops_per_step`: this rank's FLOPs per step.
    - `peak_flops`: dense peak FLOP/s of this rank's device for the training dtype.
    - `links`: tier -> alpha-beta model, for the ideal time of pipeline p2p transfers
      (docs/definitions.md#pipeline-bubble).
    - `window_annotation`: analyse the ranges of this annotation (a ``record_function`` name)
      instead of the profiler steps; `window_range_us`: one window ``(start, end)`` on the
      trace's ``ts`` clock (microseconds). Neither: profiler steps, else the whole trace.
    - `gloo_worker_groups`: gloo worker thread id (the trace's ``tid``) -> the name of the process
      group the thread works for, as the live agent discovers it (docs/analyze.md, "Groups of
      gloo collectives"); None: the trace's own ``mfuscope.gloo_worker_groups`` if it has one.
    """

    gpus_per_node: int | None = None
    host_of_rank: Mapping[int, str] | None = None
    axis_overrides: Mapping[str, str] = msgspec.field(default_factory=dict)
    model_flops_per_step: float | None = None
    recompute_flops_per_step: float | None = None
    peak_flops: float | None = None
    links: Mapping[str, LinkModel] | None = None
    window_annotation: str | None = None
    window_range_us: tuple[float, float] | None = None
    gloo_worker_groups: Mapping[int, str] | None = None

    @property
    def window_request(self) -> WindowRequest:
        return WindowRequest(self.window_annotation, self.window_range_us)

    def __post_init__(self) -> None:
        if self.window_range_us is not None:
            for bound in self.window_range_us:
                _check_optional_float("window_range_us", bound, positive=False)
        self.window_request  # noqa: B018 - validates the pair
        if self.gpus_per_node is not None and (
            isinstance(self.gpus_per_node, bool)
            or not isinstance(self.gpus_per_node, int)
            or self.gpus_per_node < 1
        ):
            raise ValueError(f"gpus_per_node must be an integer >= 1, got {self.gpus_per_node!r}")
        _check_optional_float("model_flops_per_step", self.model_flops_per_step, positive=False)
        _check_optional_float(
            "recompute_flops_per_step", self.recompute_flops_per_step, positive=False
        )
        _check_optional_float("peak_flops", self.peak_flops, positive=True)
        for key, axis in self.axis_overrides.items():
            if not isinstance(key, str) or not isinstance(axis, str) or not axis:
                raise ValueError(f"axis_overrides entries must be str -> non-empty str: {key!r}")
        for tid, name in (self.gloo_worker_groups or {}).items():
            if isinstance(tid, bool) or not isinstance(tid, int) or not isinstance(name, str):
                raise ValueError(f"gloo_worker_groups entries must be int -> str: {tid!r}")
        if self.links is not None:
            for tier, link in self.links.items():
                if not isinstance(link, LinkModel):
                    raise ValueError(f"links[{tier!r}] must be a LinkModel, got {link!r}")


class ExposedComm(msgspec.Struct, frozen=True):
    """Exposed communication time of one step attributed to one (axis, tier), in seconds."""

    axis: str
    tier: str
    seconds: float


class CollectiveRecord(msgspec.Struct, frozen=True):
    """One collective or p2p operation observed in a step (docs/definitions.md#bus-bandwidth).

    `bytes` is the full array size S as nccl-tests defines it (None when the trace does not say);
    `seconds` the duration of its kernel (GPU) or gloo work (CPU), including any wait for peers;
    `algbw = S / seconds`, `busbw = algbw * bus_factor(op, group_size)` (None when S or the group
    is unknown); `overlapped_ratio` the fraction of `seconds` hidden under compute or recompute.
    `group_size` is None when the trace does not say which group ran it, with the reason in
    `group_size_reason`.
    """

    op: str
    axis: str
    tier: str
    group_size: int | None
    bytes: int | None
    seconds: float
    algbw_bytes_per_s: float | None
    busbw_bytes_per_s: float | None
    overlapped_ratio: float
    group_size_reason: str | None = None


class CommSpan(msgspec.Struct, frozen=True):
    """The collectives of one (op, axis, tier) in a step, from the first one's start to the last
    one's end (clipped to the step's window): `busy_s` is the compute and recompute time in that
    span, in seconds, the most those collectives could hide under as the step ran. Steps between
    profiled windows weigh their own collective durations against it
    (docs/definitions.md#carried-gpu-steps)."""

    op: str
    axis: str
    tier: str
    busy_s: float


class KernelClassSeconds(msgspec.Struct, frozen=True):
    """Seconds of a bucket (compute or recompute) per kernel class (`kernel_classes`); they
    sum to the bucket. Kernels of several classes at once share the instant equally."""

    gemm: float = 0.0
    attention: float = 0.0
    elementwise_norm_reduce: float = 0.0
    other: float = 0.0

    def as_dict(self) -> dict[str, float]:
        return {
            "gemm": self.gemm,
            "attention": self.attention,
            "elementwise_norm_reduce": self.elementwise_norm_reduce,
            "other": self.other,
        }


class StepDecomposition(msgspec.Struct, frozen=True):
    """One step window ``[start, start + wall)`` split into the step buckets
    (docs/definitions.md#step-buckets).

    ``compute_s + recompute_s + exposed_comm_s + other_s + bubble_s == wall_s`` to float
    rounding, ``bubble_s == bubble_pipeline_s + bubble_idle_s`` and ``exposed_comm_s`` is the
    sum of `exposed_comm`. `overlapped_comm_s` (communication hidden under compute) lies beside
    the buckets. `start_s` is Unix seconds when the trace carries ``baseTimeNanoseconds``,
    otherwise seconds on the trace's own clock. `mfu`/`hfu` are None when FLOPs or peak are
    unknown (`hfu` also when the step recomputes but no recompute FLOPs were given).
    `window_source` says how the window was chosen (``WINDOW_*``). `compute_classes` /
    `recompute_classes` split those buckets by kernel class (None: not known, CPU timelines).
    """

    step: int
    start_s: float
    wall_s: float
    compute_s: float
    recompute_s: float
    exposed_comm_s: float
    other_s: float
    bubble_s: float
    bubble_pipeline_s: float
    bubble_idle_s: float
    overlapped_comm_s: float
    exposed_comm: tuple[ExposedComm, ...]
    collectives: tuple[CollectiveRecord, ...]
    mfu: float | None
    hfu: float | None
    window_source: str = WINDOW_PROFILER_STEP
    compute_classes: KernelClassSeconds | None = None
    recompute_classes: KernelClassSeconds | None = None
    # (kernel family, seconds) of the compute kernels that started in the window, largest first
    # (`kernel_classes.FAMILY_NAMES`; overlapping kernels each count); empty on CPU timelines.
    compute_families: tuple[tuple[str, float], ...] = ()
    # One per (op, axis, tier) of `collectives`, sorted by it.
    comm_spans: tuple[CommSpan, ...] = ()


class RankAnalysis(msgspec.Struct, frozen=True):
    """The decomposition of every profiled step of one rank's trace.

    `device` is the device name from the trace (e.g. ``NVIDIA A100-PG509-200``) or ``cpu`` for
    CPU-only traces. `warnings`: one line each about what the trace lacks (e.g. device events
    of a GPU job), for the reader of the answer.
    """

    rank: int
    world_size: int
    device: str
    steps: tuple[StepDecomposition, ...]
    warnings: tuple[str, ...] = ()
