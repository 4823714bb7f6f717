"""Steps between profiled windows on GPU timelines: their exposed communication from their own
collective durations, in seconds (pure; docs/definitions.md#carried-gpu-steps).

A profiled window measures what no per-step source does: how much of each collective hid under
compute. The flight recorder, with NCCL's timing on, measures what no window does: every step's own
collective durations. A carried step combines the two, per class of collectives (op, axis, tier):

- from the window (`window_seconds`, over the steps the breakdown is carried from), per step on
  average: each class's collective seconds, the part of them hidden under compute, and the compute
  inside the class's span (from its first collective's start to its last one's end, the engine's
  `CommSpan`): the most that class could hide under as the step ran; the compute, recompute, other
  and pipeline-bubble seconds; the exposed communication per (axis, tier);
- per carried step (`carried_seconds`), a class whose collectives took `d` seconds in the step
  exposes ``max(d * exposed fraction in the window, d - compute in its span)``, between 0 and `d`:
  at the window's overlap while its collectives fit under the compute they overlapped, and the
  excess beyond that compute once they outgrow it (a slower link, a peer's wait inside the kernel,
  growing traffic). Compute, recompute and other are the window's seconds scaled by the step's
  FLOPs, the pipeline bubble the window's seconds, and `bubble_idle` takes the rest of the step;
  when the parts exceed the step they are scaled down to it.

The rule was chosen against a model of GPU steps that knows its own truth
(benchmarks/gpu_carried.py, docs/agent.md#carried-gpu-steps-against-a-model).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from mfuscope.core.vocabulary import COLLECTIVE_OPS, P2P_OPS, PIPELINE_AXIS, TIERS

if TYPE_CHECKING:
    from mfuscope.core.step_report import DecompositionLike

__all__ = [
    "ClassKey",
    "CommClass",
    "WindowSeconds",
    "carried_seconds",
    "class_key",
    "window_seconds",
]

UNKNOWN = "unknown"

# (op, axis, tier) of a class of collectives.
ClassKey = tuple[str, str, str]


def class_key(op: str, axis: str, tier: str) -> ClassKey:
    """The class as step reports name it: an empty axis is ``unknown``, so is a tier out of
    the vocabulary (the engine's and the flight recorder's names meet here)."""
    return (op, axis or UNKNOWN, tier if tier in TIERS else UNKNOWN)


def _carried(op: str, axis: str) -> bool:
    """Whether a class's exposed time is communication a step's durations can stand for: a
    pipeline send/recv that is not hidden is mostly a stage waiting for its peer, which the engine
    counts apart (bubble_pipeline), so it keeps the window's seconds."""
    return op in COLLECTIVE_OPS and not (op in P2P_OPS and axis == PIPELINE_AXIS)


def _finite(value: float) -> float:
    return value if math.isfinite(value) and value > 0 else 0.0


@dataclass(frozen=True)
class CommClass:
    """One class of collectives in a window, per step on average (s): their time, the part of
    it hidden under compute, and the compute inside their span (None: the engine did not say)."""

    key: ClassKey
    seconds: float
    hidden_s: float
    span_busy_s: float | None


@dataclass(frozen=True)
class WindowSeconds:
    """What a window measured, per step on average (s). `exposed`: (axis, tier, seconds) of
    exposed communication as the engine split it; `model_flops` / `recompute_flops`: the
    window steps' FLOPs (None: not known, so no scaling)."""

    compute_s: float
    recompute_s: float
    other_s: float
    bubble_pipeline_s: float
    exposed: tuple[tuple[str, str, float], ...]
    classes: tuple[CommClass, ...]
    model_flops: float | None = None
    recompute_flops: float | None = None


class _SpanLike(Protocol):
    @property
    def op(self) -> str: ...
    @property
    def axis(self) -> str: ...
    @property
    def tier(self) -> str: ...
    @property
    def busy_s(self) -> float: ...


def _mean(values: Iterable[float], n: int) -> float:
    return math.fsum(_finite(v) for v in values) / n


def window_seconds(
    steps: Sequence[DecompositionLike],
    model_flops: float | None = None,
    recompute_flops: float | None = None,
) -> WindowSeconds | None:
    """The per-step means of `steps` (the window's steps a breakdown is carried from); None
    without steps. A class's span busy time is None unless every step that ran the class has
    the engine's span for it."""
    n = len(steps)
    if n == 0:
        return None
    exposed: dict[tuple[str, str], float] = {}
    seconds: dict[ClassKey, list[float]] = {}  # [seconds, hidden, span busy, steps, spans]
    for step in steps:
        for part in step.exposed_comm:
            _, axis, tier = class_key("", part.axis, part.tier)
            exposed[(axis, tier)] = exposed.get((axis, tier), 0.0) + _finite(part.seconds) / n
        ran: set[ClassKey] = set()
        for record in step.collectives:
            key = class_key(record.op, record.axis, record.tier)
            took = _finite(record.seconds)
            ratio = record.overlapped_ratio
            hidden = took * min(max(ratio, 0.0), 1.0) if math.isfinite(ratio) else 0.0
            entry = seconds.setdefault(key, [0.0, 0.0, 0.0, 0, 0])
            entry[0] += took / n
            entry[1] += hidden / n
            if key not in ran:
                ran.add(key)
                entry[3] += 1
        spans: Sequence[_SpanLike] = getattr(step, "comm_spans", None) or ()
        for span in spans:
            key = class_key(span.op, span.axis, span.tier)
            if key in ran:
                entry = seconds[key]
                entry[2] += _finite(span.busy_s) / n
                entry[4] += 1
    classes = tuple(
        CommClass(key, took, hidden, busy if spanned == ran_in else None)
        for key, (took, hidden, busy, ran_in, spanned) in sorted(seconds.items())
        if _carried(key[0], key[1])
    )
    return WindowSeconds(
        compute_s=_mean((s.compute_s for s in steps), n),
        recompute_s=_mean((s.recompute_s for s in steps), n),
        other_s=_mean((s.other_s for s in steps), n),
        bubble_pipeline_s=_mean((s.bubble_pipeline_s for s in steps), n),
        exposed=tuple((axis, tier, value) for (axis, tier), value in sorted(exposed.items())),
        classes=classes,
        model_flops=model_flops if model_flops is not None and model_flops > 0 else None,
        recompute_flops=recompute_flops
        if recompute_flops is not None and recompute_flops > 0
        else None,
    )


def _ratio(step: float, window: float | None) -> float:
    """The step's FLOPs over the window's (1 when either is unknown or 0)."""
    if window is None or not (math.isfinite(step) and step > 0):
        return 1.0
    return step / window


def _class_exposed(known: CommClass, took: float, scale: float) -> float:
    """Exposed seconds of a class whose collectives took `took` seconds in the step."""
    if known.seconds <= 0:
        return took
    fraction = min(max((known.seconds - known.hidden_s) / known.seconds, 0.0), 1.0)
    exposed = took * fraction
    if known.span_busy_s is not None:
        exposed = max(exposed, took - known.span_busy_s * scale)
    return min(max(exposed, 0.0), took)


def _exposed_comm(
    window: WindowSeconds, durations: Mapping[ClassKey, float], scale: float
) -> tuple[dict[tuple[str, str], float], float]:
    """Exposed seconds per (axis, tier) of a step with `durations`, and its hidden seconds.

    Per (axis, tier), the window's exposed time its classes explain, `explained` (their time
    less their hidden time), and the rest, `fixed` (a barrier, a coalesced batch, pipeline
    transfers: not in the classes), carried as it was. Where collectives ran at once, the engine
    split the instant between them, so the classes' sum can exceed the engine's figure: the
    step's classes are scaled by the window's ratio (at most 1).
    """
    by_key = {c.key: c for c in window.classes}
    explained: dict[tuple[str, str], float] = {}
    for c in window.classes:
        group = (c.key[1], c.key[2])
        explained[group] = explained.get(group, 0.0) + max(c.seconds - c.hidden_s, 0.0)
    engine = {(axis, tier): value for axis, tier, value in window.exposed}
    groups = {}
    for group, value in engine.items():
        share = explained.get(group, 0.0)
        ratio = min(value / share, 1.0) if share > 0 else 1.0
        groups[group] = (ratio, max(value - share * ratio, 0.0))
    group_seconds = {group: 0.0 for group in engine}
    totals: dict[tuple[str, str], float] = {}
    for (op, axis, tier), took in durations.items():
        key = class_key(op, axis, tier)
        took = _finite(took)
        if not _carried(key[0], key[1]) or took <= 0:
            continue
        known = by_key.get(key)
        group = (key[1], key[2])
        totals[group] = totals.get(group, 0.0) + took
        if known is None:  # a class no window step ran: as exposed as its group was, else all
            group_took = math.fsum(c.seconds for c in window.classes if c.key[1:] == key[1:])
            fraction = engine.get(group, 0.0) / group_took if group_took > 0 else 1.0
            exposed = took * min(fraction, 1.0)
        else:
            exposed = _class_exposed(known, took, scale)
        group_seconds[group] = group_seconds.get(group, 0.0) + exposed
    out = {}
    for group, value in group_seconds.items():
        ratio, fixed = groups.get(group, (1.0, 0.0))
        out[group] = value * ratio + fixed
    hidden = math.fsum(totals.values()) - math.fsum(
        value * groups.get(group, (1.0, 0.0))[0] for group, value in group_seconds.items()
    )
    return out, max(hidden, 0.0)


def carried_seconds(
    window: WindowSeconds,
    wall_s: float,
    durations: Mapping[ClassKey, float],
    model_flops: float = 0.0,
    recompute_flops: float = 0.0,
) -> tuple[list[tuple[str, str, str, float]], float]:
    """The buckets of a carried step of `wall_s` seconds whose collectives took `durations`
    (seconds per (op, axis, tier)), as (component, axis, tier, seconds) summing to `wall_s` (to
    rounding), and its communication hidden under compute (s, at most `wall_s`).

    See the module docstring for the rule. `model_flops` / `recompute_flops`: the step's (0:
    unknown, no scaling).
    """
    scale = _ratio(model_flops, window.model_flops)
    exposed, hidden = _exposed_comm(window, durations, scale)
    plain = [
        ("compute", window.compute_s * scale),
        ("recompute", window.recompute_s * _ratio(recompute_flops, window.recompute_flops)),
        ("other", window.other_s * scale),
        ("bubble_pipeline", window.bubble_pipeline_s),
    ]
    parts = [(name, "", "", value) for name, value in plain]
    parts += [("exposed_comm", a, t, value) for (a, t), value in sorted(exposed.items())]
    total = math.fsum(value for *_, value in parts)
    shrink = wall_s / total if total > wall_s > 0 else 1.0
    parts = [(name, axis, tier, value * shrink) for name, axis, tier, value in parts]
    idle = 0.0 if shrink < 1 else max(wall_s - math.fsum(value for *_, value in parts), 0.0)
    parts.append(("bubble_idle", "", "", idle))
    return [p for p in parts if p[3] > 0], min(hidden, max(wall_s, 0.0))
