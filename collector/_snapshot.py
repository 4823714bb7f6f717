"""A consistent, immutable view of the collector's aggregated state at one instant.

The state builds a snapshot under its lock; the Prometheus/OTLP series (`series.py`) and the
``/v1/summary`` digest (`summary.py`) are pure functions of it, computed outside the lock.
Base units throughout (s, bytes, bytes/s, FLOP, FLOP/s); ratios are 0..1.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from mfuscope.collector._hardware import JobHardware
from mfuscope.core.hangs import HangView, ProgressExport
from mfuscope.core.schema import AgentHealth
from mfuscope.core.stragglers import Straggler

__all__ = [
    "STEP_DURATION_BOUNDS_S",
    "CollectiveTotals",
    "CollectiveWindow",
    "CollectorSnapshot",
    "ComponentTotals",
    "HistogramTotals",
    "JobSnapshot",
    "LatestWindow",
    "RankView",
    "SeriesTotals",
    "Straggler",
    "TierPeak",
]

# Upper bounds (s) of the step-duration histogram, shared by Prometheus and OTLP. Steps of LLM
# training run from tens of milliseconds (small models, many GPUs) to minutes (huge global batch).
STEP_DURATION_BOUNDS_S: tuple[float, ...] = (
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
    120.0,
    300.0,
)


@dataclass(frozen=True)
class ComponentTotals:
    """Cumulative step time in one step bucket (docs/definitions.md#step-buckets), s."""

    component: str
    axis: str
    tier: str
    seconds: float


@dataclass(frozen=True)
class CollectiveTotals:
    """Cumulative totals of one ``(op, axis, tier)``. `bytes` sums the nccl-tests size S over the
    calls whose size is known; `bus_bytes` is S times the bus factor, over the calls whose size
    and group size are both known (the factor needs n); `sized_seconds` is the duration of the
    calls with a known size, group size and duration, and `sized_bus_bytes` their bus bytes, so
    ``sized_bus_bytes / sized_seconds`` is busbw. `profiled_seconds`: collective time inside
    profiled windows, what `overlapped_seconds` is a part of. Where each comes from (flight
    recorder or profiled windows): docs/definitions.md#collective-records."""

    op: str
    axis: str
    tier: str
    calls: int
    bytes: float
    bus_bytes: float
    seconds: float
    overlapped_seconds: float
    sized_seconds: float
    sized_bus_bytes: float = 0.0
    profiled_seconds: float = 0.0


@dataclass(frozen=True)
class HistogramTotals:
    """Per-bucket counts over `STEP_DURATION_BOUNDS_S` (+Inf last), sum/min/max of the values."""

    bucket_counts: tuple[int, ...]
    sum: float
    min: float
    max: float


@dataclass(frozen=True)
class SeriesTotals:
    """The counters of one job, or of one rank of it when per-rank labels are on (`rank` set).
    `start_unix_ns` is when these counters started from zero. `reruns`: counted steps (a part
    of `steps`) whose step number an earlier incarnation of the job had already reported."""

    rank: int | None
    start_unix_ns: int
    steps: int
    step_seconds: float
    model_flops: float
    hardware_flops: float
    overlapped_comm_seconds: float
    duplicates: int
    # Sum over steps of the reporting rank's peak FLOP/s x step wall time, FLOP (0 where the peak
    # is unknown). increase(model_flops) / increase(peak_flop_seconds) is MFU over any range.
    peak_flop_seconds: float
    components: tuple[ComponentTotals, ...]
    collectives: tuple[CollectiveTotals, ...]
    step_duration: HistogramTotals
    reruns: int = 0
    # (kernel class, compute seconds) from reports that carry the split (schema 1.1)
    compute_classes: tuple[tuple[str, float], ...] = ()
    # The job-time ledger (docs/definitions.md#job-time-ledger): rank-seconds per category, in
    # the order of `core.ledger.CATEGORIES` (empty: none booked); Σ peak FLOP/s x those seconds
    # (FLOP) and the model FLOPs of the steps not redone: effective MFU is their ratio.
    time_seconds: tuple[float, ...] = ()
    time_peak_flop_seconds: float = 0.0
    useful_model_flops: float = 0.0


@dataclass(frozen=True)
class RankView:
    """One live rank (listed only when per-rank labels are on). `health`: its agent-health
    counters, adjusted for agent restarts (see `JobSnapshot`), counted since
    `health_start_unix_ns`."""

    rank: int
    peak_flops: float | None
    last_report_age_s: float
    health: AgentHealth
    health_start_unix_ns: int = 0
    closed: bool = False  # its agent closed (a normal end): no report age is exported for it


@dataclass(frozen=True)
class TierPeak:
    """The spec unidirectional link rate of the groups on `axis` at `tier`, bytes/s."""

    axis: str
    tier: str
    bytes_per_s: float


@dataclass(frozen=True)
class CollectiveWindow:
    """One ``(op, axis, tier)`` over the ranks' latest profiled steps. `busbw_bytes_per_s` is None
    when no call had a known size; `efficiency` (busbw / tier peak) when the peak is known too."""

    op: str
    axis: str
    tier: str
    calls: int
    bytes: float
    seconds: float
    busbw_bytes_per_s: float | None
    efficiency: float | None


@dataclass(frozen=True)
class LatestWindow:
    """What the job looks like now.

    - `mfu`/`hfu`: sum over ranks of (FLOPs / wall time over the rank's last `window_steps`
      steps), divided by the sum of those ranks' peaks; None when no rank has a known peak.
    - `component_fractions`: ``(component, axis, tier, fraction of step time)`` from each rank's
      latest step report that carries a breakdown, weighted by its wall time.
    - `collectives`: per ``(op, axis, tier)`` over each rank's latest profiled step.
    - `tier_busbw`: ``(axis, tier, busbw, efficiency or None)`` over the same collectives.
    """

    window_steps: int
    mfu: float | None
    hfu: float | None
    component_fractions: tuple[tuple[str, str, str, float], ...]
    collectives: tuple[CollectiveWindow, ...]
    tier_busbw: tuple[tuple[str, str, float, float | None], ...]


@dataclass(frozen=True)
class JobSnapshot:
    """One job as seen by this collector (its live ranks; counters since `start_unix_ns`).

    `health` sums the agents' cumulative health counters over every rank seen since the job's
    counters started, expired ranks included, with an agent restart's new counts added on top of
    the old ones: like every counter here it never decreases while the job lives. `restarts`:
    new incarnations (launches) of the job after the first one this collector saw.
    """

    job: str
    live_ranks: int
    world_size: int
    peak_flops: float
    peak_unknown_ranks: int
    last_report_age_s: float
    tp_spans_hosts: bool
    health: AgentHealth
    tier_peaks: tuple[TierPeak, ...]
    totals: tuple[SeriesTotals, ...]
    ranks: tuple[RankView, ...]
    latest: LatestWindow
    stragglers: tuple[Straggler, ...]
    straggler_basis: Literal["self", "wall"]
    # The host each of `stragglers` reports from (same order; "" when the agent sent none).
    straggler_hosts: tuple[str, ...] = ()
    # The node of each of `stragglers` (same order; the host when the agent sent no node).
    straggler_nodes: tuple[str, ...] = ()
    start_unix_ns: int = 0
    restarts: int = 0
    hardware: JobHardware = field(default_factory=JobHardware)
    # (axis, tier, source) of every link spec the ranks stated, ``unknown`` included
    # (docs/definitions.md#link-specs).
    tier_spec_sources: tuple[tuple[str, str, str], ...] = ()
    # Seconds since the collector received the newest profiled window of any live rank (a step
    # report carrying its own breakdown); None before the first window.
    breakdown_age_s: float | None = None
    # The largest spread between windows of any live rank: how far exposed comm's share
    # differed between its latest windows (docs/definitions.md#carried-breakdowns); None before
    # a rank has two windows.
    breakdown_spread: float | None = None
    # Every live rank's agent closed (a normal end): no report age is exported for the job, and
    # `last_report_age_s` is over the ranks that have not closed when some have not.
    all_closed: bool = False
    # Blocked ranks and the ranks they wait for (docs/definitions.md#hangs).
    hangs: HangView = field(default_factory=lambda: HangView((), (), 0))
    # What the cross-collector hang join reads: this collector's waits and the progress of its
    # overdue ranks (docs/fleet.md#hangs-across-sidecars).
    progress: ProgressExport = field(default_factory=lambda: ProgressExport((), ()))
    # (axis, tier, smoothed arrival skew s) and (rank, host, node, smoothed lateness s) of the
    # latest-arriving ranks (docs/definitions.md#arrival-skew).
    arrival_skew: tuple[tuple[str, str, float], ...] = ()
    late_arrivals: tuple[tuple[int, str, str, float], ...] = ()
    # For groups that span collectors: (rank, host, node, group, axis, tier, seq, enqueue time s)
    # of each rank's held sample, and (group, axis, tier, size) of those groups
    # (docs/fleet.md#arrival-skew-across-sidecars).
    arrival_held: tuple[tuple[int, str, str, str, str, str, int, float], ...] = ()
    arrival_groups: tuple[tuple[str, str, str, int], ...] = ()
    # Flight-recorder entries the agents' recorders overwrote before reading (cumulative).
    records_lost: int = 0
    # Which runs are the same workload (docs/compare.md): the lowest live rank's key; "" when
    # no rank sent one (agents before schema 1.3, or FLOPs not known yet).
    run_key: str = ""


@dataclass(frozen=True)
class CollectorSnapshot:
    """Everything the exporters and the summary need. `rejected` counts refused batches by reason
    since the collector started; `per_rank_labels` says whether totals are split by rank."""

    jobs: tuple[JobSnapshot, ...]
    rejected: tuple[tuple[str, int], ...]
    per_rank_labels: bool
    expire_after_s: float
