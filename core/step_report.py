"""From engine results to schema step reports: the one conversion, used by the live agent and by
`mfuscope report --traces` (pure: plain data in, plain data out).

A profiled window gives, per profiled step, the step buckets on that step's device window
and the collectives seen in it (see docs/definitions.md). They become:

- a `Breakdown`: each bucket's *fraction* of the window's total time (summed over its steps),
  exposed communication split per (axis, tier). Every later step report carries it scaled to
  that step's own measured wall time, so its components sum exactly to `wall_s` (schema rule);
  on GPU timelines whose collectives the flight recorder times, a later step carries the window's
  seconds with its own exposed communication instead (`core.carried_durations`);
- per profiled step, `CollectiveSample`s aggregated per (op, axis, tier, group_size, bytes), put
  only on that step's report so collector counters never count a collective twice;
- the compute bucket split by kernel class (when the engine split it), scaled like the
  components: the live f_elementwise slice of the MFU waterfall.

A profiled step's own report is its own decomposition in seconds as measured (`measured_s`, its
window on the trace); what its measured period holds beyond that is the profiler's own cost on the
training thread, the `instrumentation` component (docs/definitions.md#instrumentation).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol, TypeVar

from mfuscope.core.carried_durations import ClassKey, WindowSeconds, carried_seconds
from mfuscope.core.schema import ClassShare, CollectiveSample, ComponentShare, StepReport
from mfuscope.core.vocabulary import COLLECTIVE_OPS, KERNEL_CLASSES, TIERS

__all__ = [
    "BlockedSample",
    "Breakdown",
    "CollectiveLike",
    "DecompositionLike",
    "ExposedCommLike",
    "Share",
    "blocked_elsewhere_s",
    "breakdown_from_steps",
    "carried_breakdown",
    "carried_components",
    "carried_steps",
    "collective_samples",
    "components_for",
    "make_report",
    "report_from_decomposition",
]

UNKNOWN = "unknown"
_T = TypeVar("_T")
# Exposed time the engine did not attribute to an axis below this is float noise, not a bucket.
_ATTRIBUTION_SLACK_S = 1e-9


class ExposedCommLike(Protocol):
    @property
    def axis(self) -> str: ...
    @property
    def tier(self) -> str: ...
    @property
    def seconds(self) -> float: ...


class CollectiveLike(Protocol):
    @property
    def op(self) -> str: ...
    @property
    def axis(self) -> str: ...
    @property
    def tier(self) -> str: ...
    @property
    def group_size(self) -> int | None: ...
    @property
    def bytes(self) -> int | None: ...
    @property
    def seconds(self) -> float: ...
    @property
    def overlapped_ratio(self) -> float: ...


class DecompositionLike(Protocol):
    """The fields of the engine's `StepDecomposition` the agent reads (seconds)."""

    @property
    def step(self) -> int: ...
    @property
    def wall_s(self) -> float: ...
    @property
    def compute_s(self) -> float: ...
    @property
    def recompute_s(self) -> float: ...
    @property
    def exposed_comm_s(self) -> float: ...
    @property
    def other_s(self) -> float: ...
    @property
    def bubble_pipeline_s(self) -> float: ...
    @property
    def bubble_idle_s(self) -> float: ...
    @property
    def overlapped_comm_s(self) -> float: ...
    @property
    def exposed_comm(self) -> Sequence[ExposedCommLike]: ...
    @property
    def collectives(self) -> Sequence[CollectiveLike]: ...


@dataclass(frozen=True)
class Share:
    """One bucket's fraction (0..1) of a step; axis/tier only on `exposed_comm`."""

    component: str
    fraction: float
    axis: str = ""
    tier: str = ""


@dataclass(frozen=True)
class Breakdown:
    """Bucket fractions of a profiled window; `step` is the window step it is named after.
    `class_fractions`: (kernel class, fraction of the window) splitting the compute share.
    `blocked_elsewhere_s`: on a CPU timeline whose training thread's blocked time was read, what
    a step's blocked time holds beyond its exposed communication (`blocked_elsewhere_s`), from
    which the steps after the window carry their exposed communication; None: they carry the
    shares.
    `seconds`: what the window measured per step in seconds, from which the steps after it carry
    their buckets where their own collective durations are known (GPU timelines, NCCL timing).
    `data_wait_s`: the seconds per step its training thread was blocked in a data loader (the
    median over the window's steps; None: not measured)."""

    step: int
    shares: tuple[Share, ...]
    overlapped_fraction: float
    class_fractions: tuple[tuple[str, float], ...] = ()
    blocked_elsewhere_s: float | None = None
    seconds: WindowSeconds | None = None
    data_wait_s: float | None = None


class _ClassSecondsLike(Protocol):
    def as_dict(self) -> dict[str, float]: ...


def _class_totals(steps: Sequence[DecompositionLike]) -> dict[str, float]:
    """Compute seconds per kernel class over `steps` (the engine's `compute_classes`); empty
    when any step has no split (CPU timelines), so the split is never partial."""
    totals = dict.fromkeys(KERNEL_CLASSES, 0.0)
    for step in steps:
        classes: _ClassSecondsLike | None = getattr(step, "compute_classes", None)
        if classes is None:
            return {}
        for name, seconds in classes.as_dict().items():
            if name in totals:
                totals[name] += _finite(seconds)
    return totals


def _tier(tier: str) -> str:
    return tier if tier in TIERS else UNKNOWN


def _finite(value: float) -> float:
    return value if math.isfinite(value) and value > 0 else 0.0


def breakdown_from_steps(
    steps: Sequence[DecompositionLike], breakdown_step: int
) -> Breakdown | None:
    """Average bucket fractions over `steps` (weighted by their wall time).

    Returns None when the steps cover no time. Exposed communication the engine left without an
    axis is kept as axis ``unknown`` so the fractions still sum to 1.
    """
    total = math.fsum(_finite(s.wall_s) for s in steps)
    if total <= 0:
        return None
    plain = {
        "compute": math.fsum(_finite(s.compute_s) for s in steps),
        "recompute": math.fsum(_finite(s.recompute_s) for s in steps),
        "other": math.fsum(_finite(s.other_s) for s in steps),
        "bubble_pipeline": math.fsum(_finite(s.bubble_pipeline_s) for s in steps),
        "bubble_idle": math.fsum(_finite(s.bubble_idle_s) for s in steps),
    }
    exposed: dict[tuple[str, str], float] = {}
    for step in steps:
        attributed = 0.0
        for part in step.exposed_comm:
            key = (part.axis or UNKNOWN, _tier(part.tier))
            exposed[key] = exposed.get(key, 0.0) + _finite(part.seconds)
            attributed += _finite(part.seconds)
        rest = _finite(step.exposed_comm_s) - attributed
        if rest > _ATTRIBUTION_SLACK_S:
            key = (UNKNOWN, UNKNOWN)
            exposed[key] = exposed.get(key, 0.0) + rest
    bucket_total = math.fsum([*plain.values(), *exposed.values()])
    if bucket_total <= 0:
        return None
    # Normalise by the buckets' own sum: the engine guarantees it equals the window to float
    # rounding, and dividing by it makes the fractions sum to 1 whatever that rounding was.
    shares = [Share(name, value / bucket_total) for name, value in plain.items() if value > 0]
    shares += [
        Share("exposed_comm", value / bucket_total, axis, tier)
        for (axis, tier), value in sorted(exposed.items())
        if value > 0
    ]
    overlapped = math.fsum(_finite(s.overlapped_comm_s) for s in steps) / bucket_total
    classes = tuple(
        (name, seconds / bucket_total) for name, seconds in _class_totals(steps).items()
    )
    return Breakdown(
        step=breakdown_step,
        shares=tuple(shares),
        overlapped_fraction=overlapped,
        class_fractions=classes,
    )


def carried_breakdown(steps: Sequence[DecompositionLike], breakdown_step: int) -> Breakdown | None:
    """The breakdown the steps after a window carry (docs/definitions.md#carried-breakdowns):
    `breakdown_from_steps` over the window's steps but its first, when it has several.

    The first step of a window is the one the profiler starts in, on every rank at once but not
    equally fast: its collectives wait for the slowest rank's start (on a 2-rank gloo job, up to
    half a second against a ~20 ms step) and that wait, real on that step, says nothing of the
    steps after it. Weighted by time as it is, it swamped the window (measured:
    benchmarks/ground_truth.py, docs/agent.md).
    """
    return breakdown_from_steps(carried_steps(sorted(steps, key=lambda s: s.step)), breakdown_step)


def carried_steps(ordered: Sequence[_T]) -> Sequence[_T]:
    """The steps of a window (in step order) whose breakdown later steps carry: all but the
    first when there are several (`carried_breakdown` says why)."""
    return ordered[1:] if len(ordered) > 1 else ordered


@dataclass(frozen=True)
class BlockedSample:
    """One profiled step on a CPU timeline: how long the training thread was blocked over its
    whole period, less the blocked time the agent could name (a data loader's fetch, the
    profiler's own start and stop), and how long it waited for a CPU (run delay); its exposed
    communication and idle seconds as measured on the trace."""

    blocked_s: float
    run_delay_s: float
    exposed_comm_s: float
    idle_s: float


def blocked_elsewhere_s(samples: Sequence[BlockedSample]) -> float | None:
    """What a step's blocked time holds beyond its exposed communication, from a window's
    profiled steps in step order (docs/definitions.md#carried-breakdowns); None when there is no
    sample. A carried step's exposed communication is its blocked time less this.

    Per step: its blocked time less its exposed communication. That is its blocked time outside
    communication (a sleep, a queue, a wait for the GIL: idle on the trace) less the part of its
    communication it spent runnable rather than blocked (preempted inside a collective's call, or
    waiting for a CPU while the collective ran), which the trace counts in the collective and
    carried steps have too; so it can be negative. It is bounded by the step's idle time above
    (blocked time outside communication is idle) and by minus its run delay below. Then the
    upper quartile (nearest rank) over the steps but the first, when there are several: of the 2
    steps a window of 3 leaves, the larger. The first is the step the profiler starts in (as in
    `carried_breakdown`): its collectives wait for the slowest rank's start, its thread for a CPU
    while every rank's profiler starts. The upper quartile, not the median: the profiler's own
    work makes profiled steps wait for a CPU inside their collectives more than the steps after
    the window, so the steps that waited least are the closest to them; not the largest, which
    over longer windows picks a step that blocked elsewhere (measured on both ground-truth jobs,
    docs/agent.md#carried-breakdowns-against-ground-truth).
    """
    kept = samples[1:] if len(samples) > 1 else samples
    values = sorted(
        min(
            max(_finite(s.blocked_s) - _finite(s.exposed_comm_s), -_finite(s.run_delay_s)),
            _finite(s.idle_s),
        )
        for s in kept
    )
    return values[int(0.75 * (len(values) - 1) + 0.5)] if values else None


def carried_components(
    breakdown: Breakdown,
    wall_s: float,
    blocked_s: float | None,
    data_wait_s: float | None = None,
) -> tuple[ComponentShare, ...]:
    """The components a step of `wall_s` seconds after the window carries.

    On a CPU timeline (`breakdown.blocked_elsewhere_s` and the step's `blocked_s` known) whose
    window saw exposed communication: the step's exposed communication is its own blocked time
    less the window's blocked time elsewhere (0 to `wall_s`), split over axes and tiers as in the
    window; the time it waited for data (`data_wait_s`, blocked in a data loader) beyond the
    window's is `bubble_idle`; the other buckets share the rest as in the window. Otherwise
    `components_for`.
    """
    elsewhere = breakdown.blocked_elsewhere_s
    comm = [s for s in breakdown.shares if s.component == "exposed_comm"]
    rest = [s for s in breakdown.shares if s.component != "exposed_comm"]
    comm_fraction = math.fsum(s.fraction for s in comm)
    rest_fraction = math.fsum(s.fraction for s in rest)
    if (
        elsewhere is None
        or blocked_s is None
        or not math.isfinite(blocked_s)
        or comm_fraction <= 0
        or wall_s <= 0
    ):
        return components_for(breakdown, wall_s)
    comm_s = min(max(blocked_s - elsewhere, 0.0), wall_s)
    if rest_fraction <= 0:
        comm_s = wall_s
    stalled_s = 0.0  # waiting for data beyond the window's: idle
    if data_wait_s is not None and breakdown.data_wait_s is not None and rest_fraction > 0:
        stalled_s = min(max(_finite(data_wait_s) - breakdown.data_wait_s, 0.0), wall_s - comm_s)
    comm_scale, rest_scale = comm_s / wall_s / comm_fraction, 0.0
    if rest_fraction > 0:
        rest_scale = (wall_s - comm_s - stalled_s) / wall_s / rest_fraction
    shares = [Share(s.component, s.fraction * comm_scale, s.axis, s.tier) for s in comm]
    shares += [
        Share(
            s.component,
            s.fraction * rest_scale + (stalled_s / wall_s if s.component == "bubble_idle" else 0),
        )
        for s in rest
    ]
    if stalled_s > 0 and not any(s.component == "bubble_idle" for s in rest):
        shares.append(Share("bubble_idle", stalled_s / wall_s))
    return components_for(
        Breakdown(breakdown.step, tuple(s for s in shares if s.fraction > 0), 0.0), wall_s
    )


def components_for(breakdown: Breakdown, wall_s: float) -> tuple[ComponentShare, ...]:
    """`breakdown` scaled to a step of `wall_s` seconds; the seconds sum to `wall_s` exactly.

    The rounding residual of the scaling goes to the largest component.
    """
    if not breakdown.shares or wall_s <= 0:
        return ()
    seconds = [share.fraction * wall_s for share in breakdown.shares]
    largest = max(range(len(seconds)), key=seconds.__getitem__)
    seconds[largest] = max(wall_s - math.fsum(seconds[:largest] + seconds[largest + 1 :]), 0.0)
    return tuple(
        ComponentShare(component=s.component, seconds=value, axis=s.axis, tier=s.tier)
        for s, value in zip(breakdown.shares, seconds, strict=True)
    )


def collective_samples(records: Iterable[CollectiveLike]) -> tuple[CollectiveSample, ...]:
    """Aggregate collective records per (op, axis, tier, group_size, bytes).

    Records whose op is not an nccl-tests collective name are left out (the schema would reject
    them). A group size that is unknown (None, or not positive) stays None: the collective's time
    and bytes count, and it gets no bus bytes downstream. `overlapped_s = seconds *
    overlapped_ratio`.
    """
    totals: dict[tuple[str, str, str, int | None, int | None], list[float]] = {}
    for record in records:
        group_size = record.group_size
        if record.op not in COLLECTIVE_OPS:
            continue
        if group_size is not None and group_size < 1:
            group_size = None
        seconds = _finite(record.seconds)
        ratio = (
            min(max(record.overlapped_ratio, 0.0), 1.0)
            if math.isfinite(record.overlapped_ratio)
            else 0.0
        )
        size = record.bytes if record.bytes is not None and record.bytes >= 0 else None
        key = (record.op, record.axis or UNKNOWN, _tier(record.tier), group_size, size)
        entry = totals.setdefault(key, [0.0, 0.0, 0.0])
        entry[0] += 1
        entry[1] += seconds
        entry[2] += seconds * ratio
    return tuple(
        CollectiveSample(
            op=op,
            axis=axis,
            tier=tier,
            group_size=group_size,
            bytes=size,
            count=int(count),
            seconds=seconds,
            overlapped_s=min(overlapped, seconds),
        )
        for (op, axis, tier, group_size, size), (count, seconds, overlapped) in sorted(
            totals.items(),
            key=lambda item: (item[0][:3], item[0][3] or -1, item[0][4] or -1),
        )
    )


def make_report(
    *,
    step: int,
    start_unix_ns: int,
    wall_s: float,
    model_flops: float,
    recompute_flops: float,
    breakdown: Breakdown | None,
    collectives: tuple[CollectiveSample, ...] = (),
    measured_s: float | None = None,
    blocked_s: float | None = None,
    durations: Mapping[ClassKey, float] | None = None,
    data_wait_s: float | None = None,
) -> StepReport:
    """One schema step report; components are `breakdown` scaled to `wall_s` (empty if None).

    `measured_s`: the step's profiled window on the trace (s), when `breakdown` is its own: the
    breakdown is scaled to it and the rest of `wall_s` is `instrumentation`. Else the step
    carries a window's breakdown: from its own collective `durations` (seconds per (op, axis,
    tier), GPU timelines) where they and the window's seconds are known (`carried_seconds`),
    else `carried_components` (on CPU timelines `blocked_s`: the time its training thread was
    blocked outside what the agent could name, `data_wait_s`: in a data loader).
    """
    if (
        breakdown is not None
        and breakdown.seconds is not None
        and durations is not None
        and measured_s is None
        and wall_s > 0
    ):
        return _report_from_durations(
            breakdown,
            breakdown.seconds,
            durations,
            step=step,
            start_unix_ns=start_unix_ns,
            wall_s=wall_s,
            model_flops=model_flops,
            recompute_flops=recompute_flops,
        )
    if breakdown is None:
        components: tuple[ComponentShare, ...] = ()
    elif measured_s is not None and 0 < measured_s < wall_s:
        components = (
            *components_for(breakdown, measured_s),
            ComponentShare(component="instrumentation", seconds=wall_s - measured_s),
        )
    elif measured_s is not None:
        components = components_for(breakdown, wall_s)
    else:
        components = carried_components(breakdown, wall_s, blocked_s, data_wait_s)
    measured = wall_s if measured_s is None or not 0 < measured_s < wall_s else measured_s
    return StepReport(
        step=step,
        start_unix_ns=start_unix_ns,
        wall_s=wall_s,
        model_flops=model_flops,
        recompute_flops=recompute_flops,
        components=components,
        overlapped_comm_s=0.0 if breakdown is None else breakdown.overlapped_fraction * measured,
        breakdown_step=None if breakdown is None else breakdown.step,
        collectives=collectives,
        compute_classes=()
        if breakdown is None or wall_s <= 0
        else tuple(ClassShare(name, f * measured) for name, f in breakdown.class_fractions),
    )


def _report_from_durations(
    breakdown: Breakdown,
    window: WindowSeconds,
    durations: Mapping[ClassKey, float],
    *,
    step: int,
    start_unix_ns: int,
    wall_s: float,
    model_flops: float,
    recompute_flops: float,
) -> StepReport:
    """A carried step's report from its own collective durations (`carried_seconds`); the
    compute split by kernel class as in the window, scaled to the step's compute."""
    parts, hidden_s = carried_seconds(window, wall_s, durations, model_flops, recompute_flops)
    shares = tuple(Share(name, value / wall_s, axis, tier) for name, axis, tier, value in parts)
    components = components_for(Breakdown(breakdown.step, shares, 0.0), wall_s)
    compute_s = math.fsum(c.seconds for c in components if c.component == "compute")
    fractions = breakdown.class_fractions
    total = math.fsum(f for _, f in fractions)
    classes = tuple(ClassShare(name, compute_s * f / total) for name, f in fractions if total > 0)
    return StepReport(
        step=step,
        start_unix_ns=start_unix_ns,
        wall_s=wall_s,
        model_flops=model_flops,
        recompute_flops=recompute_flops,
        components=components,
        overlapped_comm_s=hidden_s,
        breakdown_step=breakdown.step,
        compute_classes=classes,
    )


def report_from_decomposition(
    step: DecompositionLike, *, start_unix_ns: int, model_flops: float, recompute_flops: float
) -> StepReport:
    """The step report of one decomposed step on its own: its breakdown, its collectives."""
    return make_report(
        step=step.step,
        start_unix_ns=start_unix_ns,
        wall_s=step.wall_s,
        model_flops=model_flops,
        recompute_flops=recompute_flops,
        breakdown=breakdown_from_steps([step], step.step),
        collectives=collective_samples(step.collectives),
    )
