"""Fit the alpha-beta (Hockney) model ``t = alpha + bytes / beta`` to observed transfers (pure).

The fit is a weighted linear least-squares of time on bytes. Observations span orders of magnitude
in size, so an unweighted fit would be decided by the largest messages alone; we minimise the
*relative* residual ``(t_i - alpha - x_i / beta) / t_i`` instead (weights ``1 / t_i**2``, times any
per-point weight such as the number of calls a point stands for). The sums are taken about the
weighted means so that sizes of ~1e9 bytes do not cancel catastrophically.

Physical constraints: ``alpha >= 0`` and ``beta > 0``. When the unconstrained optimum has a
negative intercept, the fit is redone through the origin (alpha = 0); when time does not grow with
size (slope <= 0) or all sizes are equal, there is no bandwidth to fit and the result is None.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from mfuscope.core.bandwidth import LinkModel, ideal_transfer_s

__all__ = ["AlphaBetaFit", "fit_alpha_beta"]


@dataclass(frozen=True)
class AlphaBetaFit:
    """A fitted link model and how well it describes the points it came from."""

    link: LinkModel
    points: int
    rms_relative_error: float  # sqrt(weighted mean of ((t - model) / t)^2), a ratio

    @property
    def half_bandwidth_bytes(self) -> float:
        """n_1/2 = alpha * beta: the size at which the model reaches half of beta, in bytes.

        Transfers much smaller than n_1/2 are latency-bound, much larger ones bandwidth-bound.
        """
        return self.link.alpha_s * self.link.beta_bytes_per_s


def fit_alpha_beta(
    sizes_bytes: Sequence[float],
    seconds: Sequence[float],
    weights: Sequence[float] | None = None,
) -> AlphaBetaFit | None:
    """Fit ``seconds ~ alpha + sizes_bytes / beta`` (seconds, bytes, bytes/s); None if unfittable.

    Points with a non-positive time or weight, or a negative size, are ignored. `weights` (default
    1 each) multiply the relative-error weight ``1 / t**2`` of each point.
    """
    if len(sizes_bytes) != len(seconds):
        raise ValueError(f"{len(sizes_bytes)} sizes but {len(seconds)} times")
    if weights is not None and len(weights) != len(seconds):
        raise ValueError(f"{len(weights)} weights for {len(seconds)} points")
    pts = [
        (float(x), float(t), (1.0 if weights is None else float(weights[i])) / (t * t))
        for i, (x, t) in enumerate(zip(sizes_bytes, seconds, strict=True))
        if t > 0 and x >= 0 and (weights is None or weights[i] > 0)
    ]
    finite = all(math.isfinite(v) for p in pts for v in p)
    if len(pts) < 2 or not finite:
        return None
    xs = [x for x, _, _ in pts]
    if max(xs) - min(xs) <= 1e-12 * max(xs):
        return None  # one size only: alpha and beta cannot be told apart
    total_w = math.fsum(w for _, _, w in pts)
    mean_x = math.fsum(w * x for x, _, w in pts) / total_w
    mean_t = math.fsum(w * t for _, t, w in pts) / total_w
    sxx = math.fsum(w * (x - mean_x) ** 2 for x, _, w in pts)
    sxt = math.fsum(w * (x - mean_x) * (t - mean_t) for x, t, w in pts)
    if not sxx > 0:
        return None  # sizes too close together (or subnormal) to carry a slope
    inverse_beta = sxt / sxx
    alpha = mean_t - inverse_beta * mean_x
    if alpha < 0:
        # Constrained optimum on the boundary alpha = 0: least squares through the origin.
        alpha = 0.0
        sxx_origin = math.fsum(w * x * x for x, _, w in pts)
        if not sxx_origin > 0:
            return None
        inverse_beta = math.fsum(w * x * t for x, t, w in pts) / sxx_origin
    if not (inverse_beta > 0 and math.isfinite(1.0 / inverse_beta) and math.isfinite(alpha)):
        return None
    link = LinkModel(alpha_s=alpha, beta_bytes_per_s=1.0 / inverse_beta)
    # w * (t - model)^2 == c * ((t - model) / t)^2 with c the caller's weight, w * t^2.
    residual = math.fsum(w * (t - ideal_transfer_s(link, x)) ** 2 for x, t, w in pts)
    caller_weight = math.fsum(w * t * t for _, t, w in pts)
    return AlphaBetaFit(
        link=link, points=len(pts), rms_relative_error=math.sqrt(residual / caller_weight)
    )
