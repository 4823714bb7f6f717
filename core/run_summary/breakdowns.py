"""Where the step goes: per-rank step decomposition, the MFU waterfall, MFU/HFU per step (pure).

Definitions: docs/definitions.md#step-buckets, docs/definitions.md#mfu-and-hfu.
A step's components split its wall time into the buckets `compute`,
`recompute`, `exposed_comm` (per axis and tier), `other`, `bubble_pipeline` and `bubble_idle`.
With peak FLOP/s P, ``MFU = model_flops / (P * wall)`` and ``HFU = (model + recompute FLOPs) /
(P * wall)``. Aggregates over several ranks and steps are ratios of sums, weighted by each rank's
peak, so they equal what PromQL computes from the counters
(``sum(rate(model_flops)) / sum(peak)``) and stay exact when devices differ.

The MFU waterfall is `core.mfu.mfu_waterfall` on the peak-weighted sums of the buckets: with
``f_x = Σ P·bucket_x / Σ P·wall`` and kernel efficiency ``model_flops / (P · compute)``,
``1 - MFU = f_exposed_comm + f_bubble + f_recompute + f_other + f_compute · (1 -
kernel_efficiency)``, so the slices below plus MFU sum to 1. The kernel slice is split in two
when the steps carry their compute time per kernel class
(docs/definitions.md#unfused-and-memory-bound-kernels): the unfused, memory-bound kernels (class
``elementwise_norm_reduce``) apart from the rest of kernel inefficiency. The ratios themselves
are `core.mfu.utilization`.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass

from mfuscope.core.mfu import StepBuckets, mfu_waterfall, utilization
from mfuscope.core.run_summary.coverage import is_measured
from mfuscope.core.run_summary.run_data import RankRun, RunData
from mfuscope.core.schema import StepReport
from mfuscope.core.vocabulary import COMPONENTS, KERNEL_CLASSES, WATERFALL_SLICES

__all__ = [
    "RankDecomposition",
    "Segment",
    "StepUtilization",
    "Waterfall",
    "WaterfallSlice",
    "decomposition_per_rank",
    "job_waterfall",
    "overall_utilization",
    "segment_label",
    "utilization_over_steps",
]

KERNEL_INEFFICIENCY = "kernel inefficiency"
# The part of the kernel slice spent in unfused, memory-bound kernels (`core.mfu`'s
# ``elementwise`` slice): shown apart, it is the share kernel fusion can win back.
UNFUSED_KERNELS = "unfused kernels"
_ELEMENTWISE_CLASS = KERNEL_CLASSES[2]  # elementwise_norm_reduce


def segment_label(component: str, axis: str = "", tier: str = "") -> str:
    """Display label of a component; exposed communication is split by axis and tier."""
    if component == "exposed_comm" and axis:
        return f"exposed comm {axis}/{tier}"
    return component.replace("_", " ")


def _segment_key(component: str, axis: str, tier: str) -> tuple[int, str, str]:
    return (COMPONENTS.index(component), axis, tier)


@dataclass(frozen=True)
class Segment:
    """Mean seconds per step that one rank spent in one bucket (exposed comm: per axis/tier)."""

    component: str
    axis: str
    tier: str
    seconds: float

    @property
    def label(self) -> str:
        return segment_label(self.component, self.axis, self.tier)


@dataclass(frozen=True)
class RankDecomposition:
    """One rank's mean step over its measured steps (`steps` of them, in profiled windows)."""

    rank: int
    steps: int
    mean_step_s: float
    segments: tuple[Segment, ...]

    def fraction(self, component: str) -> float:
        """Share of the mean step in `component` (all axes/tiers summed), a ratio 0..1."""
        if self.mean_step_s <= 0:
            return 0.0
        total = math.fsum(s.seconds for s in self.segments if s.component == component)
        return total / self.mean_step_s


def _decomposed(rank: RankRun) -> Iterator[StepReport]:
    """The steps whose buckets were measured (in a profiled window): a carried breakdown is an
    earlier window's, scaled, and would weight that window by the steps that followed it."""
    return (s for s in rank.steps if is_measured(s))


def decomposition_per_rank(run: RunData) -> tuple[RankDecomposition, ...]:
    """Per rank, the mean seconds per measured step in each bucket; every rank gets the same
    segment keys (zeros where absent) so stacked bars share one legend. Ranks with no measured
    step are left out."""
    keys = sorted(
        {
            _segment_key(c.component, c.axis, c.tier)
            for r in run.ranks
            for s in _decomposed(r)
            for c in s.components
        }
    )
    result = []
    for rank in run.ranks:
        steps = list(_decomposed(rank))
        if not steps:
            continue
        sums: dict[tuple[int, str, str], list[float]] = {k: [] for k in keys}
        for step in steps:
            for c in step.components:
                sums[_segment_key(c.component, c.axis, c.tier)].append(c.seconds)
        segments = tuple(
            Segment(COMPONENTS[k[0]], k[1], k[2], math.fsum(sums[k]) / len(steps)) for k in keys
        )
        mean = math.fsum(s.wall_s for s in steps) / len(steps)
        result.append(RankDecomposition(rank.rank, len(steps), mean, segments))
    return tuple(result)


@dataclass(frozen=True)
class WaterfallSlice:
    label: str
    component: str  # a vocabulary component, UNFUSED_KERNELS or KERNEL_INEFFICIENCY
    fraction: float  # of the peak FLOPs the devices could have done (may be < 0, see Waterfall)


@dataclass(frozen=True)
class Waterfall:
    """Slices of ``1 - MFU`` in waterfall order; ``sum(slices) + mfu == 1`` to float rounding.

    `kernel_efficiency` above 1 (a negative kernel-inefficiency slice) means compute ran faster
    than the peak allows: the peak figure is too low (e.g. a short CPU calibration).
    """

    mfu: float
    hfu: float
    kernel_efficiency: float | None  # None when no compute time was observed
    slices: tuple[WaterfallSlice, ...]
    samples: int  # measured (rank, step) pairs aggregated


def _peaked(run: RunData) -> Iterator[tuple[float, StepReport]]:
    for rank in run.ranks:
        if rank.peak_flops is not None:
            yield from ((rank.peak_flops, s) for s in rank.steps)


def job_waterfall(run: RunData) -> Waterfall | None:
    """The job's MFU waterfall over the measured steps (profiled windows) of ranks with a known
    peak (`core.mfu.mfu_waterfall` on the peak-weighted sums of the buckets); its MFU is that of
    those steps, not of the whole run.

    None when FLOPs or peaks are unknown or no step was measured.
    """
    if not run.flops_known:
        return None
    samples = [(p, s) for p, s in _peaked(run) if is_measured(s)]
    peak_time = math.fsum(p * s.wall_s for p, s in samples)  # FLOPs the devices could have done
    if not samples or not peak_time > 0:
        return None
    # Each rank's seconds weighted by its peak, expressed at the job's wall-weighted mean peak,
    # so the ratios are the ratio-of-sums (Σ P·bucket / Σ P·wall) the module docstring defines.
    mean_peak = peak_time / math.fsum(s.wall_s for _, s in samples)
    by_key: dict[tuple[int, str, str], list[float]] = {}
    for peak, step in samples:
        for c in step.components:
            key = _segment_key(c.component, c.axis, c.tier)
            by_key.setdefault(key, []).append(peak * c.seconds / mean_peak)
    seconds = {k: math.fsum(v) for k, v in by_key.items()}
    per_component = {
        name: math.fsum(v for k, v in seconds.items() if COMPONENTS[k[0]] == name)
        for name in COMPONENTS
    }
    # Steps without a class split (CPU timelines, older agents) add nothing to the slice.
    split = any(s.compute_classes for _, s in samples)
    elementwise_s = math.fsum(
        peak * c.seconds / mean_peak
        for peak, step in samples
        for c in step.compute_classes
        if c.kernel_class == _ELEMENTWISE_CLASS
    )
    core = mfu_waterfall(
        math.fsum(s.model_flops for _, s in samples),
        mean_peak,
        StepBuckets.of(
            per_component,
            elementwise_s=min(elementwise_s, per_component["compute"]),  # equal, to rounding
        ),
    )
    slice_of = core.slices()
    keys_per_component = Counter(COMPONENTS[k[0]] for k in seconds)
    keys = sorted(
        (k for k in seconds if COMPONENTS[k[0]] != "compute"),
        key=lambda k: (WATERFALL_SLICES.index(COMPONENTS[k[0]]), k),
    )
    slices = [
        WaterfallSlice(
            segment_label(COMPONENTS[k[0]], k[1], k[2]),
            COMPONENTS[k[0]],
            # A bucket split per (axis, tier) (exposed communication) gets each part's share.
            slice_of[COMPONENTS[k[0]]]
            if keys_per_component[COMPONENTS[k[0]]] == 1
            else seconds[k] / core.window_s,
        )
        for k in keys
    ]
    if split:
        slices.append(WaterfallSlice(UNFUSED_KERNELS, UNFUSED_KERNELS, core.elementwise))
    slices.append(
        WaterfallSlice(KERNEL_INEFFICIENCY, KERNEL_INEFFICIENCY, core.kernel_inefficiency)
    )
    hfu = utilization(math.fsum(s.hardware_flops for _, s in samples), peak_time)
    return Waterfall(core.mfu, hfu or 0.0, core.kernel_efficiency, tuple(slices), len(samples))


@dataclass(frozen=True)
class StepUtilization:
    """Job-level MFU and HFU of one step over the `ranks` that reported it with a known peak."""

    step: int
    mfu: float
    hfu: float
    ranks: int


def _utilization(pairs: list[tuple[float, StepReport]]) -> tuple[float | None, float | None]:
    """(MFU, HFU) of (peak, step) pairs as a ratio of sums (`core.mfu.utilization`)."""
    peak_time = math.fsum(p * s.wall_s for p, s in pairs)
    return (
        utilization(math.fsum(s.model_flops for _, s in pairs), peak_time),
        utilization(math.fsum(s.hardware_flops for _, s in pairs), peak_time),
    )


def utilization_over_steps(run: RunData) -> tuple[StepUtilization, ...]:
    """MFU/HFU per step (ratio of sums over ranks); empty when FLOPs or peaks are unknown."""
    if not run.flops_known:
        return ()
    per_step: dict[int, list[tuple[float, StepReport]]] = {}
    for peak, step in _peaked(run):
        per_step.setdefault(step.step, []).append((peak, step))
    result = []
    for number in sorted(per_step):
        pairs = per_step[number]
        mfu, hfu = _utilization(pairs)
        if mfu is not None and hfu is not None:
            result.append(StepUtilization(number, mfu, hfu, len(pairs)))
    return tuple(result)


def overall_utilization(run: RunData) -> tuple[float, float] | None:
    """(MFU, HFU) over every step of every rank with a known peak; None when unknown."""
    if not run.flops_known:
        return None
    pairs = list(_peaked(run))
    if not pairs:
        return None
    mfu, hfu = _utilization(pairs)
    return None if mfu is None or hfu is None else (mfu, hfu)
