"""MFU, HFU, kernel efficiency and the MFU waterfall: the one definition of each
(docs/definitions.md#mfu-and-hfu, docs/definitions.md#mfu-waterfall). The engine, the collector,
the report and `calc` all call these.

For one rank and one window of wall time ``W = t1 - t0`` (seconds) on a device of dense peak
``P`` (FLOP/s):

- ``MFU = model_flops / (P * W)``: the useful arithmetic of the model against what the hardware
  could have done. Recomputation is not in the numerator.
- ``HFU = (model_flops + recompute_flops) / (P * W)``: everything the hardware actually computed
  (activation recomputation included). HFU >= MFU always.
- Over several ranks or steps, the ratio of sums: ``sum(FLOPs) / sum(P_i * W_i)``, so devices of
  different peaks weigh by their peak and the result equals what PromQL computes from counters
  (`utilization` takes the two sums).
- The waterfall explains the gap. With the step buckets (which partition W exactly),
  ``f_x = bucket_x / W`` and ``kernel_efficiency = model_flops / (P * compute)``:

      1 - MFU = f_exposed_comm + f_bubble + f_recompute + f_other + f_instrumentation
                + f_compute * (1 - kernel_efficiency)

  because ``MFU = f_compute * kernel_efficiency`` and the f_x sum to 1. Every slice is a fraction
  of the window; a negative kernel slice means the FLOP count or the peak is too high (the kernels
  "beat" the peak, or FLOPs were counted in a window without compute time) and is kept as is so
  the error shows instead of being clipped away.
- The kernel slice is split in two (docs/analyze.md, "Kernel classes"): ``f_elementwise``, the
  fraction of the window the compute bucket spends in unfused / memory-bound kernels (class
  ``elementwise_norm_reduce``: elementwise, norms, softmax, reductions, optimizer kernels, whose
  FLOPs are negligible next to the matmuls'), and the rest:

      f_compute * (1 - kernel_efficiency) = f_elementwise + kernel_inefficiency

  so the identity above holds exactly with both slices. Without a class split
  ``f_elementwise`` is 0 and ``kernel_inefficiency`` is the whole kernel slice.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import msgspec
from mfuscope.core.vocabulary import COMPONENTS, WATERFALL_SLICES

__all__ = [
    "MfuWaterfall",
    "StepBuckets",
    "achieved_flops_per_s",
    "hfu",
    "hfu_or_none",
    "mfu",
    "mfu_or_none",
    "mfu_waterfall",
    "utilization",
]


def _check(peak_flops: float, wall_s: float, **flops: float) -> None:
    if not (peak_flops > 0 and math.isfinite(peak_flops)):
        raise ValueError(f"peak_flops must be a finite number > 0 FLOP/s, got {peak_flops}")
    if not (wall_s > 0 and math.isfinite(wall_s)):
        raise ValueError(f"wall_s must be a finite number > 0 s, got {wall_s}")
    for name, value in flops.items():
        if not (value >= 0 and math.isfinite(value)):
            raise ValueError(f"{name} must be a finite number >= 0 FLOPs, got {value}")


def _defined(ratio: float | None) -> float:
    if ratio is None:  # only when peak * wall underflows to 0
        raise ValueError("peak_flops * wall_s is 0: no FLOPs could have been done")
    return ratio


def achieved_flops_per_s(flops: float, wall_s: float) -> float:
    """FLOP/s achieved: `flops` (FLOPs) done in `wall_s` (s)."""
    if not (wall_s > 0 and math.isfinite(wall_s)):
        raise ValueError(f"wall_s must be a finite number > 0 s, got {wall_s}")
    if not (flops >= 0 and math.isfinite(flops)):
        raise ValueError(f"flops must be a finite number >= 0, got {flops}")
    return flops / wall_s


def utilization(flops: float, possible_flops: float) -> float | None:
    """FLOPs done over the FLOPs the hardware could have done: ``flops / possible_flops``, a ratio.

    `possible_flops` is ``peak_flops * wall_s`` (FLOP), or its sum over ranks and steps for a job
    (a ratio of sums); both arguments may also be rates (FLOP/s done over peak FLOP/s). None when
    nothing could have been done (`possible_flops` <= 0): no time, or no known peak.
    """
    if not possible_flops > 0:
        return None
    return flops / possible_flops


def mfu_or_none(model_flops: float, peak_flops: float | None, wall_s: float) -> float | None:
    """`mfu`, or None when the peak is unknown or the window is empty (no check of the FLOPs)."""
    if peak_flops is None:
        return None
    return utilization(model_flops, peak_flops * wall_s) if wall_s > 0 else None


def hfu_or_none(
    model_flops: float, recompute_flops: float | None, peak_flops: float | None, wall_s: float
) -> float | None:
    """`hfu`, or None when the peak, the window or the recompute FLOPs are unknown."""
    if recompute_flops is None:
        return None
    return mfu_or_none(model_flops + recompute_flops, peak_flops, wall_s)


def mfu(model_flops: float, peak_flops: float, wall_s: float) -> float:
    """Model FLOPs utilization: ``model_flops / (peak_flops * wall_s)``, a ratio (0..1 when sane).

    `model_flops` are the FLOPs of one device over the window (recomputation excluded), `peak_flops`
    the device's dense peak in FLOP/s for the training dtype, `wall_s` the window in seconds.
    """
    _check(peak_flops, wall_s, model_flops=model_flops)
    return _defined(utilization(model_flops, peak_flops * wall_s))


def hfu(model_flops: float, recompute_flops: float, peak_flops: float, wall_s: float) -> float:
    """Hardware FLOPs utilization: ``(model_flops + recompute_flops) / (peak_flops * wall_s)``."""
    _check(peak_flops, wall_s, model_flops=model_flops, recompute_flops=recompute_flops)
    return _defined(utilization(model_flops + recompute_flops, peak_flops * wall_s))


class StepBuckets(msgspec.Struct, frozen=True):
    """One window split into the step buckets, in seconds; they sum to the window. One field
    ``<bucket>_s`` per bucket of `mfuscope.core.vocabulary.COMPONENTS` (a test checks), which
    everything else here iterates."""

    compute_s: float
    recompute_s: float = 0.0
    exposed_comm_s: float = 0.0
    other_s: float = 0.0
    bubble_pipeline_s: float = 0.0
    bubble_idle_s: float = 0.0
    instrumentation_s: float = 0.0
    # Of `compute_s`: the time in elementwise_norm_reduce kernels (not a bucket of its own).
    elementwise_s: float = 0.0

    def __post_init__(self) -> None:
        for name in self.__struct_fields__:
            value = getattr(self, name)
            if not (value >= 0 and math.isfinite(value)):
                raise ValueError(f"{name} must be a finite number >= 0 s, got {value}")
        if not self.window_s > 0:
            raise ValueError("the buckets sum to 0 s: an empty window has no MFU")
        if self.elementwise_s > self.compute_s * (1 + 1e-9) + 1e-12:
            raise ValueError(
                f"elementwise_s {self.elementwise_s} s is part of compute_s {self.compute_s} s"
            )

    @classmethod
    def of(cls, seconds: Mapping[str, float], elementwise_s: float = 0.0) -> StepBuckets:
        """From seconds per bucket name (a missing bucket is 0 s)."""
        fields = {f"{c}_s": float(seconds.get(c, 0.0)) for c in COMPONENTS}
        return cls(**fields, elementwise_s=elementwise_s)

    def seconds(self, component: str) -> float:
        """The seconds of bucket `component`."""
        value: float = getattr(self, f"{component}_s")
        return value

    @property
    def window_s(self) -> float:
        return math.fsum(self.seconds(c) for c in COMPONENTS)


class MfuWaterfall(msgspec.Struct, frozen=True):
    """Where the gap between peak and achieved model FLOP/s went, as fractions of the window.

    ``mfu + exposed_comm + bubble_pipeline + bubble_idle + recompute + other + instrumentation
    + elementwise + kernel_inefficiency == 1`` (to float rounding). `elementwise` is
    ``f_elementwise`` (unfused / memory-bound kernels), `kernel_inefficiency` the rest of the
    kernel slice. `kernel_efficiency`
    is None when no compute time was observed (and the model FLOPs are then 0, so the kernel
    slices are 0 too).
    """

    mfu: float
    exposed_comm: float
    bubble_pipeline: float
    bubble_idle: float
    recompute: float
    other: float
    kernel_inefficiency: float
    kernel_efficiency: float | None
    window_s: float
    elementwise: float = 0.0
    instrumentation: float = 0.0

    @property
    def bubble(self) -> float:
        return self.bubble_pipeline + self.bubble_idle

    def slices(self) -> dict[str, float]:
        """The slices of ``1 - MFU`` by name, in `WATERFALL_SLICES` order (for tables)."""
        return {name: getattr(self, name) for name in WATERFALL_SLICES}


def mfu_waterfall(model_flops: float, peak_flops: float, buckets: StepBuckets) -> MfuWaterfall:
    """The MFU waterfall of one window (see the module docstring for the identity).

    `buckets` may also be sums over ranks and steps, each rank's seconds weighted by its peak over
    `peak_flops` (the report does so for a job). When `model_flops` > 0 but no compute time was
    observed, the FLOPs and the timeline disagree: `kernel_efficiency` is None and the kernel
    slice is ``-MFU`` (the identity still holds and the error shows).
    """
    window = buckets.window_s
    _check(peak_flops, window, model_flops=model_flops)
    mfu_value = _defined(utilization(model_flops, peak_flops * window))
    efficiency = utilization(model_flops, peak_flops * buckets.compute_s)
    # f_compute * (1 - efficiency) == f_compute - MFU; written so it also holds without compute.
    kernel_slice = buckets.compute_s / window - mfu_value
    elementwise = buckets.elementwise_s / window
    # Every bucket but compute is a slice of its own: its fraction of the window.
    fractions = {c: buckets.seconds(c) / window for c in COMPONENTS if c != "compute"}
    return MfuWaterfall(
        mfu=mfu_value,
        kernel_inefficiency=kernel_slice - elementwise,
        kernel_efficiency=efficiency,
        window_s=window,
        elementwise=elementwise,
        **fractions,
    )
