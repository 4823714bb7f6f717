"""Building blocks of promtool rule tests fed by profiled windows (see window_cadence.py): the
window schedule, counters in promtool's series notation, and expected alerts and samples.

Times are whole minutes of a 1 min scrape and evaluation interval; values are exact fractions.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from fractions import Fraction
from pathlib import Path
from typing import Any

import yaml

ALERT_RULES = Path(__file__).resolve().parents[2] / "deploy/prometheus/rules/mfuscope-alerts.yml"
FIRST_WINDOW = 2  # minute of the first profiled window

Increment = Callable[[int], Fraction]
Case = dict[str, Any]


def windows(cadence: int, last: int) -> list[int]:
    """Window minutes up to `last`: `cadence` apart on average, every third one a minute late
    (steps do not line up with scrapes), so gaps of cadence + 1 and cadence - 1 occur."""
    starts = (FIRST_WINDOW + k * cadence + (k % 3 == 1) for k in range(last // cadence + 1))
    return [w for w in starts if w <= last]


def latest_window(cadence: int, minute: int) -> int | None:
    done = windows(cadence, minute)
    return done[-1] if done else None


def first_window_from(cadence: int, minute: int, last: int) -> int:
    return next(w for w in windows(cadence, last) if w >= minute)


def settled(cadence: int, window: int) -> int:
    """The first minute whose 5 min range holds `window` alone: a range sees a jump only with the
    sample before it, so the previous window drops out 5 min after it."""
    earlier = [w for w in windows(cadence, window) if w < window]
    return max(window, earlier[-1] + 5) if earlier else window


def encode(values: list[Fraction | None], stale: bool) -> str:
    """promtool's expanding notation: `a+bxn` is a then n steps of b, `axn` a held n more times,
    `_` no sample, a final `stale` when the series is dropped.

    Every value must be exact in binary: promtool adds the steps up in floating point, and a sum
    that lands a hair below the next written value would read as a counter reset."""
    inexact = [v for v in values if v is not None and Fraction(float(v)) != v]
    if inexact:
        raise ValueError(f"{float(inexact[0])!r} is not exact in binary")
    parts: list[str] = []
    i = 0
    while i < len(values):
        start = values[i]
        if start is None:
            parts.append("_")
            i += 1
            continue
        j = i + 1
        step: Fraction | None = None
        while j < len(values):
            before, value = values[j - 1], values[j]
            if value is None or before is None or (step is not None and value - before != step):
                break
            step = value - before
            j += 1
        text = f"{float(start):.12g}"
        if step is not None:
            text += (f"+{float(step):.12g}" if step else "") + f"x{j - 1 - i}"
        parts.append(text)
        i = j
    return " ".join(parts + (["stale"] if stale else []))


def counter(increment: Increment, minutes: int, last_step: int, stale: bool) -> str:
    """A counter over `minutes` samples from 0 at minute 0, `increment(m)` added at each minute m
    up to `last_step`, flat after it."""
    total, values = Fraction(0), list[Fraction | None]()
    for minute in range(minutes):
        if 0 < minute <= last_step:
            total += increment(minute)
        values.append(total)
    return encode(values, stale)


def series(name: str, labels: str, values: str) -> dict[str, str]:
    return {"series": f"{name}{{{labels}}}", "values": values}


def alert_rule(alert: str, severity: str = "warning") -> dict[str, Any]:
    groups = yaml.safe_load(ALERT_RULES.read_text(encoding="utf-8"))["groups"]
    return next(
        rule
        for group in groups
        for rule in group["rules"]
        if rule.get("alert") == alert and rule["labels"]["severity"] == severity
    )


def render(text: str, labels: dict[str, str], value: Fraction) -> str:
    """An annotation as Prometheus renders it, for the label and percentage templates only."""
    text = re.sub(r"\{\{ \$labels\.(\w+) \}\}", lambda m: labels[m[1]], text)
    text = text.replace("{{ $value | humanizePercentage }}", f"{float(value) * 100:.4g}%")
    if "{{" in text:
        raise ValueError(f"cannot render {text!r}: write the expected text out")
    return text


def alerts(alert: str, minute: int, firing: list[tuple[dict[str, str], Fraction]]) -> Case:
    """`alert` (severity warning) at `minute` fires for exactly the (labels, value) pairs given,
    its annotations rendered from the rule."""
    rule = alert_rule(alert)
    expected = [
        {
            "exp_labels": {"severity": "warning", **labels},
            "exp_annotations": {
                k: render(v, labels, value) for k, v in rule["annotations"].items()
            },
        }
        for labels, value in firing
    ]
    return {"eval_time": f"{minute}m", "alertname": alert, "exp_alerts": expected}


def samples(expr: str, minute: int, expected: list[tuple[str, float]]) -> Case:
    """`expr` at `minute` gives exactly the (labels, value) samples in `expected`."""
    return {
        "expr": expr,
        "eval_time": f"{minute}m",
        "exp_samples": [{"labels": labels, "value": value} for labels, value in expected],
    }
