"""Run against run: the comparable figures of one run, their deltas, and the regression gate (pure).

Definitions: docs/compare.md. A `RunProfile` holds what `mfuscope compare` sets side by side, each
figure computed elsewhere by its one definition (the report's aggregates of `core.run_summary`
for traces and agent output, the collector's digest for a summary); this module only aligns two
profiles by key and takes differences. A figure one side lacks is None there and has no delta.

The gate (`regression`) compares MFU when both sides know it (FLOPs and peak), else mean step
time: the candidate is *worse by* ``(MFU_base - MFU_cand) / MFU_base``, or ``(step_cand -
step_base) / step_base``, a ratio (positive: worse).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = [
    "CollectiveFigures",
    "Comparison",
    "Regression",
    "Row",
    "RunProfile",
    "comparable",
    "compare",
    "describe_peaks",
    "regression",
    "size_warnings",
]


@dataclass(frozen=True)
class CollectiveFigures:
    """One ``(op, axis, tier)``: calls and nccl-tests bytes per measured rank-step, and busbw
    (bytes/s, over the calls of known size and duration; None when none)."""

    op: str
    axis: str
    tier: str
    calls_per_step: float
    bytes_per_step: float
    busbw_bytes_per_s: float | None


@dataclass(frozen=True)
class RunProfile:
    """What one side measured, and its figures.

    `waterfall` holds the MFU waterfall's slices ``(label, fraction of the peak FLOPs)`` when FLOPs
    and peak are known (else empty); `shares` each bucket's share of the measured step time
    (the same fractions for every slice but compute's, when the ranks' peaks are equal).
    `kernel_classes` are ``(class, mean compute seconds per measured step)``, `kernel_families`
    ``(family, mean kernel seconds per step)`` (traces only), both averaged over ranks.
    `stragglers` are ``(rank, ratio to the job median)``, slowest first.
    """

    kind: str  # "traces", "agent output" or "collector summary"
    source: str
    job: str
    world_size: int
    ranks: int
    steps: int  # distinct step numbers
    rank_steps: int
    windows: int | None  # profiled windows (None: the input does not say)
    measured_rank_steps: int | None
    devices: tuple[str, ...]
    peak_flops: tuple[float, ...]  # the distinct dense peaks of the ranks' devices, FLOP/s
    mean_step_s: float | None
    mfu: float | None
    hfu: float | None
    waterfall: tuple[tuple[str, float], ...]
    shares: tuple[tuple[str, float], ...]
    kernel_classes: tuple[tuple[str, float], ...] = ()
    kernel_families: tuple[tuple[str, float], ...] = ()
    collectives: tuple[CollectiveFigures, ...] = ()
    stragglers: tuple[tuple[int, float], ...] = ()
    named_stragglers: tuple[int, ...] = ()
    run_key: str = ""  # which runs are the same workload (docs/compare.md); "": not known
    # Where the peaks came from (vocabulary.PEAK_SOURCES: spec, measured, user); () unknown.
    peak_sources: tuple[str, ...] = ()
    # useful model FLOPs over the peak x every rank-second (docs/definitions.md#effective-mfu)
    effective_mfu: float | None = None


@dataclass(frozen=True)
class Row:
    """One figure of both sides; `delta` is candidate - baseline, `relative` that over the
    baseline (None where a side lacks the figure or the baseline is 0)."""

    label: str
    baseline: float | None
    candidate: float | None

    @property
    def delta(self) -> float | None:
        if self.baseline is None or self.candidate is None:
            return None
        return self.candidate - self.baseline

    @property
    def relative(self) -> float | None:
        delta = self.delta
        if delta is None or self.baseline is None or self.baseline == 0:
            return None
        return delta / abs(self.baseline)


@dataclass(frozen=True)
class Regression:
    """The gate's figure: `metric` is ``"mfu"`` or ``"mean_step_s"``; `worse_by` a ratio
    (positive: the candidate is worse; see the module docstring)."""

    metric: str
    baseline: float
    candidate: float
    worse_by: float

    def exceeds(self, max_ratio: float) -> bool:
        return self.worse_by > max_ratio


@dataclass(frozen=True)
class Comparison:
    baseline: RunProfile
    candidate: RunProfile
    headline: tuple[Row, ...]  # mean step time, MFU, HFU, effective MFU
    slices: tuple[Row, ...]  # the waterfall's when both sides have one, else bucket shares
    slices_are_waterfall: bool
    kernel_classes: tuple[Row, ...]
    kernel_families: tuple[Row, ...]  # the families that grew most, largest growth first
    collectives: tuple[tuple[CollectiveFigures | None, CollectiveFigures | None], ...]
    stragglers: tuple[Row, ...]  # per rank: ratio to the job median
    regression: Regression | None
    warnings: tuple[str, ...]


def _rows(
    base: tuple[tuple[str, float], ...], cand: tuple[tuple[str, float], ...]
) -> tuple[Row, ...]:
    """Rows for every label of either side, in the baseline's order then the candidate's new
    ones; a label a side lacks counts as absent (None), not zero."""
    b, c = dict(base), dict(cand)
    labels = list(b) + [label for label in c if label not in b]
    return tuple(Row(label, b.get(label), c.get(label)) for label in labels)


def _grown(
    base: tuple[tuple[str, float], ...], cand: tuple[tuple[str, float], ...], top: int
) -> tuple[Row, ...]:
    """The `top` families whose time per step grew most, when both sides have families; a
    family one side lacks counts 0 there (a kernel that appears or vanishes is a change)."""
    if not base or not cand:
        return ()
    b, c = dict(base), dict(cand)
    rows = [Row(name, b.get(name, 0.0), c.get(name, 0.0)) for name in {*b, *c}]
    rows.sort(key=lambda r: (-(r.delta or 0.0), r.label))
    return tuple(r for r in rows[:top] if (r.delta or 0.0) > 0)


def regression(base: RunProfile, cand: RunProfile) -> Regression | None:
    """MFU when both sides have it (> 0), else mean step time; None when neither compares."""
    if base.mfu is not None and cand.mfu is not None and base.mfu > 0:
        return Regression("mfu", base.mfu, cand.mfu, (base.mfu - cand.mfu) / base.mfu)
    if base.mean_step_s and cand.mean_step_s is not None:
        worse = (cand.mean_step_s - base.mean_step_s) / base.mean_step_s
        return Regression("mean_step_s", base.mean_step_s, cand.mean_step_s, worse)
    return None


def comparable(base: RunProfile, cand: RunProfile) -> str | None:
    """Why the two sides do not compare at all (one line), or None when they do."""
    for side, profile in (("baseline", base), ("candidate", cand)):
        if not profile.mean_step_s:
            return f"the {side} ({profile.source}) has no step with a wall time to compare"
    return None


def _same_peaks(a: tuple[float, ...], b: tuple[float, ...]) -> bool:
    """Whether the mean peaks agree to 0.1 % (a summary gives only the ranks' sum)."""
    x, y = sum(a) / len(a), sum(b) / len(b)
    return abs(x - y) <= 1e-3 * max(x, y)


def describe_peaks(peaks: tuple[float, ...], sources: tuple[str, ...] = ()) -> str:
    """Peaks as text, e.g. ``100 GFLOP/s, 110 GFLOP/s (measured)``."""
    scale, unit = (1e12, "TFLOP/s") if max(peaks) >= 1e12 else (1e9, "GFLOP/s")
    rates = ", ".join(f"{p / scale:.4g} {unit}" for p in peaks)
    return f"{rates} ({', '.join(sources)})" if sources else rates


def _peak_warnings(base: RunProfile, cand: RunProfile) -> list[str]:
    """Peaks that differ between the sides, or between the ranks of one side: each MFU is
    against its own peak, so an MFU change then mixes speed with the peak."""
    out = []
    for side, p in (("baseline", base), ("candidate", cand)):
        if len(p.peak_flops) > 1 and not _same_peaks(p.peak_flops[:1], p.peak_flops[-1:]):
            rates = describe_peaks(p.peak_flops)
            out.append(
                f"the {side}'s ranks used different peaks ({rates}): its MFU weighs each rank "
                "against its own"
            )
    if base.peak_flops and cand.peak_flops and not _same_peaks(base.peak_flops, cand.peak_flops):
        measured = "measured" in base.peak_sources or "measured" in cand.peak_sources
        before = describe_peaks(base.peak_flops, base.peak_sources)
        after = describe_peaks(cand.peak_flops, cand.peak_sources)
        out.append(
            f"peaks differ: baseline {before}, candidate {after} (each side's MFU is against its "
            "own peak, so the MFU change mixes speed with the peak; mean step time compares "
            "speed alone"
            + (
                "; a measured CPU peak is calibrated once per machine and thread count, "
                "`mfuscope calc --calibrate` measures it again)"
                if measured
                else ")"
            )
        )
    return out


def size_warnings(base: RunProfile, cand: RunProfile) -> tuple[str, ...]:
    """What differs in kind or size between the sides: the deltas are still shown."""
    out = []
    if base.run_key and cand.run_key and base.run_key != cand.run_key:
        out.append(
            f"run keys differ: baseline {base.run_key}, candidate {cand.run_key} (another model "
            "FLOPs count, world size, layout, device or dtype, or a user's key)"
        )
    if base.world_size != cand.world_size:
        out.append(
            f"world sizes differ: baseline {base.world_size}, candidate {cand.world_size} "
            "(per-step figures are per rank; totals are not comparable)"
        )
    if base.ranks != cand.ranks:
        out.append(f"ranks measured differ: baseline {base.ranks}, candidate {cand.ranks}")
    if base.devices and cand.devices and base.devices != cand.devices:
        out.append(
            f"devices differ: baseline {', '.join(base.devices) or '?'}, "
            f"candidate {', '.join(cand.devices) or '?'}"
        )
    out += _peak_warnings(base, cand)
    if (base.mfu is None) != (cand.mfu is None):
        known = "baseline" if base.mfu is not None else "candidate"
        out.append(f"only the {known} has MFU (FLOPs and a peak): the gate uses mean step time")
    if base.kind != cand.kind:
        out.append(
            f"the sides are different inputs ({base.kind} vs {cand.kind}): a collector summary "
            "covers its latest window, a trace or agent output every step it holds"
        )
    return tuple(out)


def compare(base: RunProfile, cand: RunProfile, *, top_families: int = 5) -> Comparison:
    """Align two profiles figure by figure (`comparable` first: this assumes they are)."""
    headline = (
        Row("mean step time", base.mean_step_s, cand.mean_step_s),
        Row("MFU", base.mfu, cand.mfu),
        Row("HFU", base.hfu, cand.hfu),
        Row("effective MFU", base.effective_mfu, cand.effective_mfu),
    )
    keyed_b = {(c.op, c.axis, c.tier): c for c in base.collectives}
    keyed_c = {(c.op, c.axis, c.tier): c for c in cand.collectives}
    collectives = tuple(
        (keyed_b.get(key), keyed_c.get(key)) for key in sorted({*keyed_b, *keyed_c})
    )
    ratio_b = {str(rank): ratio for rank, ratio in base.stragglers}
    ratio_c = {str(rank): ratio for rank, ratio in cand.stragglers}
    ranks = sorted({*ratio_b, *ratio_c}, key=int)
    stragglers = tuple(Row(f"rank {r}", ratio_b.get(r), ratio_c.get(r)) for r in ranks)
    waterfall = bool(base.waterfall and cand.waterfall)
    return Comparison(
        baseline=base,
        candidate=cand,
        headline=headline,
        slices=_rows(base.waterfall, cand.waterfall)
        if waterfall
        else _rows(base.shares, cand.shares),
        slices_are_waterfall=waterfall,
        kernel_classes=_rows(base.kernel_classes, cand.kernel_classes),
        kernel_families=_grown(base.kernel_families, cand.kernel_families, top_families),
        collectives=collectives,
        stragglers=stragglers,
        regression=regression(base, cand),
        warnings=size_warnings(base, cand),
    )
