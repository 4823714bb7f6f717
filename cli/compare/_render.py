"""`mfuscope compare`'s output: the side-by-side text table, and ``mfuscope.compare/1`` JSON."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import asdict
from typing import Any

from mfuscope.core.run_summary.comparison import (
    CollectiveFigures,
    Comparison,
    Row,
    RunProfile,
    describe_peaks,
)

__all__ = ["JSON_FORMAT", "measured_line", "render_json", "render_text"]

JSON_FORMAT = "mfuscope.compare/1"
_LABEL = 34


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" + "s" * (n != 1)


def measured_line(profile: RunProfile) -> str:
    """What one side measured: job, ranks, steps, windows."""
    parts = [
        f"{profile.kind}, job {profile.job!r}",
        f"{profile.ranks} of {profile.world_size} ranks",
        f"{_plural(profile.steps, 'step')} ({profile.rank_steps} rank-steps)",
    ]
    if profile.windows is not None:
        windows = _plural(profile.windows, "profiled window")
        if profile.measured_rank_steps is not None:
            windows += f" ({profile.measured_rank_steps} measured rank-steps)"
        parts.append(windows)
    if profile.kind == "collector summary":
        parts.append("MFU and buckets of its latest window")
    if profile.devices:
        parts.append("device " + ", ".join(profile.devices))
    if profile.peak_flops:
        parts.append("peak " + describe_peaks(profile.peak_flops, profile.peak_sources))
    if profile.run_key:
        parts.append(f"run key {profile.run_key}")
    return "; ".join(parts)


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value * 1e3:.3f} ms"


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value:.1%}"


def _relative(row: Row) -> str:
    rel = row.relative
    return "" if rel is None else f" ({rel:+.1%})"


def _line(row: Row, fmt: Callable[[float | None], str], delta: Callable[[Row], str]) -> str:
    label = row.label if len(row.label) <= _LABEL else row.label[: _LABEL - 1] + "…"
    return f"  {label:<{_LABEL}} {fmt(row.baseline):>12} {fmt(row.candidate):>12}  {delta(row)}"


def _delta_ms(row: Row) -> str:
    d = row.delta
    return "" if d is None else f"{d * 1e3:+.3f} ms{_relative(row)}"


def _delta_points(row: Row) -> str:
    d = row.delta
    return "" if d is None else f"{d * 100:+.1f} pp{_relative(row)}"


def _size(n: float | None) -> str:
    if n is None:
        return "-"
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{n:.0f} B"


def _busbw(value: float | None) -> str:
    return "-" if value is None else f"{value / 1e9:.3f} GB/s"


def _change(base: float | None, cand: float | None) -> str:
    if base is None or cand is None or base == 0:
        return ""
    return f" ({(cand - base) / abs(base):+.1%})"


def _collective(pair: tuple[CollectiveFigures | None, CollectiveFigures | None]) -> list[str]:
    base, cand = pair
    some = base or cand
    assert some is not None
    fields: list[tuple[str, Callable[[float | None], str], float | None, float | None]] = [
        (
            "calls/step",
            lambda v: "-" if v is None else f"{v:.2f}",
            base.calls_per_step if base else None,
            cand.calls_per_step if cand else None,
        ),
        (
            "bytes/step",
            _size,
            base.bytes_per_step if base else None,
            cand.bytes_per_step if cand else None,
        ),
        (
            "busbw",
            _busbw,
            base.busbw_bytes_per_s if base else None,
            cand.busbw_bytes_per_s if cand else None,
        ),
    ]
    out = [f"  {some.op} {some.axis}/{some.tier}"]
    for name, fmt, b, c in fields:
        out.append(f"    {name:<{_LABEL - 2}} {fmt(b):>12} {fmt(c):>12}  {_change(b, c).strip()}")
    return out


def render_text(
    comparison: Comparison, paths: Sequence[str], gate: float | None, exceeded: bool
) -> str:
    """The comparison for people: what each side measured, then each figure of both sides with
    its delta (candidate - baseline), then the gate's verdict when one was asked for."""
    base, cand = comparison.baseline, comparison.candidate
    out = [
        f"baseline:  {paths[0]}",
        f"           {measured_line(base)}",
        f"candidate: {paths[1]}",
        f"           {measured_line(cand)}",
        "",
        f"  {'':<{_LABEL}} {'baseline':>12} {'candidate':>12}  delta",
    ]
    step, *ratios = comparison.headline
    out.append(_line(step, _ms, _delta_ms))
    out += [_line(row, _pct, _delta_points) for row in ratios]
    if comparison.slices:
        kind = (
            "MFU waterfall (share of the peak FLOPs lost to each slice)"
            if comparison.slices_are_waterfall
            else "step buckets (share of the measured step time)"
        )
        out += ["", kind]
        out += [_line(row, _pct, _delta_points) for row in comparison.slices]
    if comparison.kernel_classes:
        out += ["", "compute by kernel class (per measured step, mean over ranks)"]
        out += [_line(row, _ms, _delta_ms) for row in comparison.kernel_classes]
    if comparison.kernel_families:
        out += ["", "kernel families that grew most (kernel time per step, mean over ranks)"]
        out += [_line(row, _ms, _delta_ms) for row in comparison.kernel_families]
    if comparison.collectives:
        out += ["", "collectives (per measured rank-step; busbw over calls of known size)"]
        for pair in comparison.collectives:
            out += _collective(pair)
    if comparison.stragglers:
        out += ["", "stragglers (straggler step time over the job median)"]
        out += [
            _line(row, lambda v: "-" if v is None else f"×{v:.3f}", _delta_ratio)
            for row in comparison.stragglers
        ]
        for name, profile in (("baseline", base), ("candidate", cand)):
            named = ", ".join(f"rank {r}" for r in profile.named_stragglers) or "none"
            out.append(f"  named stragglers, {name}: {named}")
    regression = comparison.regression
    if regression is not None:
        what = "MFU" if regression.metric == "mfu" else "mean step time"
        change = "worse" if regression.worse_by > 0 else "better"
        verdict = f"candidate {what} {change} by {abs(regression.worse_by):.1%}"
        if gate is not None:
            verdict += f" (limit {gate:.1%}): " + ("REGRESSION" if exceeded else "ok")
        out += ["", verdict]
    return "\n".join(out) + "\n"


def _delta_ratio(row: Row) -> str:
    d = row.delta
    return "" if d is None else f"{d:+.3f}"


def _rows(rows: Sequence[Row]) -> list[dict[str, Any]]:
    return [
        {
            "label": r.label,
            "baseline": r.baseline,
            "candidate": r.candidate,
            "delta": r.delta,
            "relative": r.relative,
        }
        for r in rows
    ]


def render_json(
    comparison: Comparison, paths: Sequence[str], gate: float | None, exceeded: bool
) -> str:
    """``mfuscope.compare/1``: both profiles as measured, every row with its delta, the gate."""
    regression = comparison.regression
    document = {
        "format": JSON_FORMAT,
        "paths": {"baseline": paths[0], "candidate": paths[1]},
        "baseline": asdict(comparison.baseline),
        "candidate": asdict(comparison.candidate),
        "headline": _rows(comparison.headline),
        "slices": _rows(comparison.slices),
        "slices_are_waterfall": comparison.slices_are_waterfall,
        "kernel_classes_s": _rows(comparison.kernel_classes),
        "kernel_families_grown_s": _rows(comparison.kernel_families),
        "collectives": [
            {
                "baseline": None if b is None else asdict(b),
                "candidate": None if c is None else asdict(c),
            }
            for b, c in comparison.collectives
        ],
        "stragglers": _rows(comparison.stragglers),
        "regression": None if regression is None else asdict(regression),
        "gate": None if gate is None else {"max_regression": gate, "exceeded": exceeded},
        "warnings": list(comparison.warnings),
    }
    return json.dumps(document, allow_nan=False) + "\n"
