"""The parts of `mfuscope analyze`'s text output that say what a figure is of, or why it is `-`.

Each rank's block says which peak MFU is against (and where it came from), gives the MFU waterfall
over the rank's steps, the bus bandwidth of each collective against the spec of its tier, and a
reason for every `-` it prints; the same reasons go into the JSON's ``warnings``. Imported after
the engine (numpy) is loaded.
"""

from __future__ import annotations

import math

from mfuscope.core.bandwidth import busbw_efficiency
from mfuscope.core.hardware import PeakLookup
from mfuscope.core.mfu import StepBuckets, mfu_waterfall
from mfuscope.core.trace.options import trace_tier_specs
from mfuscope.core.trace.result import RankAnalysis
from mfuscope.core.vocabulary import SLICE_TITLES, TRACE_COMPONENTS

__all__ = ["missing_value_reasons", "of_spec", "peak_words", "waterfall_line"]


def peak_words(lookup: PeakLookup) -> str:
    """The peak MFU is against, and its source, for the rank's header line."""
    if lookup.peak_flops is None:
        return "peak unknown"
    where = {"spec": "datasheet table", "user": "--peak-flops"}.get(lookup.source, lookup.source)
    return f"peak {lookup.peak_flops / 1e12:.4g} TFLOP/s ({where})"


def _recompute_s(rank: RankAnalysis) -> float:
    return math.fsum(s.recompute_s for s in rank.steps)


def missing_value_reasons(
    rank: RankAnalysis,
    lookup: PeakLookup,
    *,
    model_flops_given: bool,
    recompute_flops_given: bool,
) -> list[str]:
    """One line per kind of `-` in the rank's output, saying why and how to fill it in."""
    reasons = []
    if not model_flops_given:
        reasons.append(
            "MFU and HFU '-': no model FLOPs per step (pass --model-flops-per-step, e.g. "
            "from `mfuscope calc`)"
        )
    elif lookup.peak_flops is None:
        reasons.append(f"MFU and HFU '-': {lookup.message}")
    elif not recompute_flops_given and _recompute_s(rank) > 0:
        reasons.append(
            f"HFU '-': the steps recompute activations ({_recompute_s(rank) * 1e3:.3f} ms of "
            "recompute kernels) but --recompute-flops-per-step was not given; MFU does not need "
            "them"
        )
    records = [c for s in rank.steps for c in s.collectives]
    unsized = [c for c in records if c.bytes is None]
    if unsized:
        reasons.append(
            f"busbw '-' for {len(unsized)} collective calls: the trace gives no size for them "
            "(no input dims on their kernels)"
        )
    ungrouped = [c for c in records if c.bytes is not None and c.group_size is None]
    if ungrouped:
        why = sorted({c.group_size_reason or "group unknown" for c in ungrouped})
        reasons.append(
            f"busbw '-' for {len(ungrouped)} collective calls of unknown group size: "
            f"{'; '.join(why)}"
        )
    specs = trace_tier_specs(rank.device)
    unspecced = sorted({c.tier for c in records if c.tier not in specs})
    if unspecced:
        reasons.append(
            f"'of spec' is '-' on {', '.join(unspecced)}: "
            + (
                "a CPU or unknown device has no link spec"
                if not specs
                else "the spec across nodes depends on the NICs each node drives, which a trace "
                "does not say"
            )
        )
    return reasons


def of_spec(rank: RankAnalysis, tier: str, busbw_bytes_per_s: float | None) -> str:
    """Bus bandwidth as a share of the tier's spec (`-` when either is unknown)."""
    efficiency = busbw_efficiency(busbw_bytes_per_s, trace_tier_specs(rank.device).get(tier))
    return "      -" if efficiency is None else f"{efficiency:7.1%}"


def waterfall_line(rank: RankAnalysis) -> str | None:
    """The MFU waterfall over all of the rank's steps (`core.mfu.mfu_waterfall` on the summed
    buckets; model FLOPs enter only as MFU x wall, so a peak of 1 FLOP/s stands in). None when
    MFU is unknown."""
    if not rank.steps or any(s.mfu is None for s in rank.steps):
        return None
    total = math.fsum
    buckets = StepBuckets.of(
        {c: total(getattr(s, f"{c}_s") for s in rank.steps) for c in TRACE_COMPONENTS},
        elementwise_s=total(
            min(s.compute_classes.elementwise_norm_reduce, s.compute_s)
            for s in rank.steps
            if s.compute_classes is not None
        ),
    )
    try:
        waterfall = mfu_waterfall(
            total((s.mfu or 0.0) * s.wall_s for s in rank.steps), 1.0, buckets
        )
    except ValueError:  # model FLOPs but no compute time: no honest split
        return None
    slices = " - ".join(
        f"{SLICE_TITLES[name]} {fraction:.1%}"
        for name, fraction in waterfall.slices().items()
        if abs(fraction) >= 5e-4
    )
    first, last = rank.steps[0].step, rank.steps[-1].step
    span = f"step {first}" if len(rank.steps) == 1 else f"steps {first}-{last}"
    return f"  waterfall ({span}): MFU {waterfall.mfu:.1%} = 100% - {slices}"
