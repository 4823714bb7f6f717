"""Writes deploy/prometheus/tests/window_cadence_test.yml: the promtool test of the rules and
alerts whose inputs come from profiled windows, fed counters shaped as the collector exports them.

    python -m tests.support.window_cadence   # regenerate; a unit test checks it is current

Each job is one rank scraped every minute. Collective time (and the overlap) either jumps once per
profiled window (3 steps every 5, 10 or 30 min, the first at minute 2, every third a minute late)
and stays flat in between (gloo, which times no collective outside windows), or rises at every
scrape (NCCL with timing); collective traffic (calls, bytes) rises at every scrape (the agents'
flight-recorder records), except in one case of an older agent whose traffic, too, jumps at
windows. busbw and overlap divide counters of one source, so each shape gives the same figures.
Step components rise at every scrape, split by the latest window's breakdown (the agent scales it
to every step), so their split changes only at a window. Jobs: "slow" runs its dp all_reduces at
10 % of the link spec, "healthy" at 85 %, "degrades" at 85 %, then 10 % from minute 65 to 115. A
window measures the link as it is then; until the next window every figure keeps that window's
value. The jobs report their last step at minute 150; the collector keeps their counters flat
until it expires the ranks at 155 and drops the series (stale). The five parts (three cadences, an
agent without records, collectives timed on every step) run as one test group, each part's jobs
labelled with its name (`slow-5m`, ...): promtool's cost is per evaluation of every rule, so one
group of five costs about what one part does. The MFU regression case: window_regression.py.

The expectations follow from those shapes, not from PromQL: a latest figure is the latest
window's from that window on; an alert with `for: 15m` fires 15 min after its condition first
holds. Prometheus evaluates rule groups independently, so an alert may read a recorded series one
evaluation late: every alert check leaves that minute of slack.
"""

from __future__ import annotations

from fractions import Fraction
from pathlib import Path

import yaml

from tests.support.window_regression import regression_case
from tests.support.window_series import (
    FIRST_WINDOW,
    Case,
    Increment,
    alerts,
    counter,
    encode,
    first_window_from,
    latest_window,
    samples,
    series,
    settled,
    windows,
)

PATH = Path(__file__).resolve().parents[2] / "deploy/prometheus/tests/window_cadence_test.yml"

CADENCES = (5, 10, 30)  # minutes between profiled windows
LAST_STEP = 150
DROPPED = 155  # the collector drops the ranks 5 min after their last report
MINUTES = 160
DEGRADED = (65, 115)  # minutes during which "degrades" reaches 10 %
SPEC = Fraction(50 * 10**9)  # B/s: one 400G port
# Per window (3 steps) of a rank: 25 all_reduces of 212.5 MB in a dp group of 2 (bus factor
# 2 x 1/2 = 1), a quarter of their time hidden under compute. Sizes and times are sums of powers
# of two (0.125 s at 85 % of the spec, 1.0625 s at 10 %), so every counter is exact in binary.
CALLS = Fraction(25)
BYTES = BUS_BYTES = Fraction(53125 * 10**5)
OVERLAPPED = Fraction(1, 4)
JOBS = ("slow", "healthy", "degrades")
OP = 'op="all_reduce", axis="dp", tier="inter_node"'
SLOW, HEALTHY = Fraction(1, 10), Fraction(85, 100)

EFFICIENCY = "job_op_axis_tier:mfuscope_collective_busbw_efficiency"
LATEST = "last1h_ratio_rate5m"
BUSBW_LOW = "MFUScopeTierBusbwLow"


def link(job: str, minute: int) -> Fraction:
    """The share of the link spec the job's collectives reach at `minute`."""
    degraded = job == "degrades" and DEGRADED[0] <= minute < DEGRADED[1]
    return SLOW if job == "slow" or degraded else HEALTHY


def breakdown(job: str, minute: int) -> dict[str, Fraction]:
    """The step components (shares of step time) a window at `minute` measures."""
    exposed = Fraction(1, 4) if link(job, minute) == SLOW else Fraction(1, 20)
    bubble = Fraction(35, 100) if job == "slow" else Fraction(1, 10)
    return {"compute": 1 - exposed - bubble, "exposed_comm": exposed, "bubble_idle": bubble}


def _counter(increment: Increment) -> str:
    return counter(increment, DROPPED, LAST_STEP, stale=True)


# Which source moves each collective counter (docs/definitions.md#collective-records): traffic
# (calls, bytes, bus bytes) comes from the agents' always-on flight-recorder records, at every
# scrape; time (and the bus bytes of the timed calls) from the recorder where the backend times
# collectives (NCCL), else from profiled windows (gloo), as does overlap. An agent without
# records sends everything from its windows.
TRAFFIC = ("calls", "bytes", "bus_bytes")
TIMING = ("seconds", "sized_seconds", "sized_bus_bytes", "overlapped_seconds", "profiled_seconds")


def _collectives(
    job: str, label: str, timing_cadence: int | None, traffic_cadence: int | None
) -> list[dict[str, str]]:
    """Collective counters: each jumps at each window (`*_cadence` min apart) or rises every
    minute (None), traffic and timing apart."""

    def per(amount: Fraction, per_byte: bool, cadence: int | None) -> Increment:
        at = set(windows(cadence, LAST_STEP)) if cadence is not None else set()

        def add(m: int) -> Fraction:
            scale = 1 / (link(job, m) * SPEC) if per_byte else Fraction(1)
            if cadence is None:  # 20 windows' worth a minute
                return 20 * amount * scale
            return amount * scale if m in at else Fraction(0)

        return add

    amounts = {
        "calls": (CALLS, False),
        "bytes": (BYTES, False),
        "bus_bytes": (BUS_BYTES, False),
        "seconds": (BUS_BYTES, True),
        "sized_seconds": (BUS_BYTES, True),
        "sized_bus_bytes": (BUS_BYTES, False),
        "overlapped_seconds": (BUS_BYTES * OVERLAPPED, True),
        "profiled_seconds": (BUS_BYTES, True),
    }
    labels = f'job="{label}", {OP}'
    return [
        series(
            f"mfuscope_collective_{name}_total",
            labels,
            _counter(per(*amounts[name], traffic_cadence if name in TRAFFIC else timing_cadence)),
        )
        for name in (*TRAFFIC, *TIMING)
    ]


def _job(
    job: str,
    label: str,
    collective_cadence: int | None,
    breakdown_cadence: int,
    traffic_cadence: int | None = None,
) -> list[dict[str, str]]:
    """The series of `job` (slow, healthy or degrades), with `label` as its job label."""

    def component(name: str) -> Increment:
        def seconds(minute: int) -> Fraction:
            window = latest_window(breakdown_cadence, minute)
            return Fraction(0) if window is None else 60 * breakdown(job, window)[name]

        return seconds

    rows = _collectives(job, label, collective_cadence, traffic_cadence)
    for name in ("compute", "exposed_comm", "bubble_idle"):
        where = 'axis="dp", tier="inter_node"' if name == "exposed_comm" else 'axis="", tier=""'
        labels = f'job="{label}", component="{name}", {where}'
        rows.append(
            series("mfuscope_step_component_seconds_total", labels, _counter(component(name)))
        )
    rows.append(series("mfuscope_ranks", f'job="{label}"', encode([Fraction(1)] * DROPPED, True)))
    where = f'job="{label}", axis="dp", tier="inter_node"'
    spec = encode([SPEC] * DROPPED, True)
    rows.append(series("mfuscope_tier_peak_bandwidth_bytes_per_second", where, spec))
    return rows


def _op(job: str) -> str:
    return f'{{job="{job}", {OP}}}'


def _busbw_low(minute: int, jobs: tuple[str, ...]) -> Case:
    labels = {"op": "all_reduce", "axis": "dp", "tier": "inter_node"}
    return alerts(BUSBW_LOW, minute, [({"job": job, **labels}, SLOW) for job in jobs])


def _latest_figures(first: int, names: dict[str, str]) -> list[Case]:
    """slow and healthy hold their figures at every evaluation from minute `first` to the last
    step (`names`: each job's label in this part)."""
    slow, healthy = names["slow"], names["healthy"]
    steady = f'{{job=~"{slow}|{healthy}"}}[{LAST_STEP - first}m]'
    per_job = {slow: SLOW, healthy: HEALTHY}
    held = [
        samples(
            f"round(1000 * {fn}({EFFICIENCY}:{LATEST}{steady}))",
            LAST_STEP,
            [(_op(job), float(1000 * eff)) for job, eff in per_job.items()],
        )
        for fn in ("min_over_time", "max_over_time")
    ]
    busbw = "job_op_axis_tier:mfuscope_collective_busbw_bytes_per_second"
    firing = f'ALERTS{{alertname="{BUSBW_LOW}", job="{healthy}"}}[{MINUTES}m]'
    mine = f'{{job=~"{"|".join(names.values())}"}}'
    return [
        *held,
        samples(
            f"count_over_time({EFFICIENCY}:{LATEST}{steady})",
            LAST_STEP,
            [(_op(job), LAST_STEP - first + 1) for job in per_job],
        ),
        samples(
            f"round({busbw}:{LATEST}{mine} / 1e6)",
            LAST_STEP,
            [(_op(names[job]), float(link(job, LAST_STEP) * SPEC / 10**6)) for job in JOBS],
        ),
        samples(
            f"round(job_op_axis_tier:mfuscope_collective_mean_bytes:{LATEST}{mine})",
            LAST_STEP,
            [(_op(names[job]), float(BYTES / CALLS)) for job in JOBS],
        ),
        samples(
            f"round(1000 * job_axis_tier:mfuscope_collective_overlapped:{LATEST}{mine})",
            LAST_STEP,
            [(f'{{job="{names[job]}", axis="dp", tier="inter_node"}}', 250.0) for job in JOBS],
        ),
        # The healthy link's alert is never even pending.
        samples(f"count_over_time({firing})", MINUTES, []),
    ]


def _breakdown_alerts(slow: tuple[str, ...]) -> list[Case]:
    return [
        alerts("MFUScopeExposedCommHigh", 58, [({"job": job}, Fraction(1, 4)) for job in slow]),
        alerts("MFUScopeBubbleHigh", 58, [({"job": job}, Fraction(35, 100)) for job in slow]),
    ]


def _windowed(cadence: int, with_records: bool = True) -> Case:
    """Timing from windows every `cadence` min; traffic from the agents' records at every scrape,
    or (an agent without records) from the same windows."""
    tag = f"{cadence}m" if with_records else f"{cadence}m-windows-only"
    names = {job: f"{job}-{tag}" for job in JOBS}
    slow, degrades = names["slow"], names["degrades"]
    mine = f'job=~"{"|".join(names.values())}"'
    bad = first_window_from(cadence, DEGRADED[0], LAST_STEP)  # the first to see the slow link
    good = first_window_from(cadence, DEGRADED[1], LAST_STEP)  # the first to see it healthy
    recovered = settled(cadence, good)
    checks = [
        (bad - 1, HEALTHY),  # the link is slow from minute 65; the latest window says 85 %
        (settled(cadence, bad), SLOW),
        (good - 1, SLOW),
        (recovered, HEALTHY),
    ]
    exprs = _latest_figures(FIRST_WINDOW, names)
    degrading = f'round(1000 * {EFFICIENCY}:{LATEST}{{job="{degrades}"}})'
    exprs += [samples(degrading, m, [(_op(degrades), float(1000 * eff))]) for m, eff in checks]
    second = windows(cadence, LAST_STEP)[1]
    if second - 1 - FIRST_WINDOW >= 5:  # the 5 min ratio is gone before the next window
        exprs.append(samples(f"{EFFICIENCY}:ratio_rate5m{{{mine}}}", second - 1, []))
    # Firing at every evaluation from 20 min on for slow; for degrades from 15 min after the
    # first slow window until the 5 min figure holds the first healthy one alone.
    firing = f'ALERTS{{alertname="{BUSBW_LOW}", alertstate="firing", {mine}}}[{LAST_STEP - 20}m]'
    labels = f'alertname="{BUSBW_LOW}", alertstate="firing", severity="warning", {OP}'
    counts = [(slow, LAST_STEP - 20 + 1), (degrades, recovered - bad - 15)]
    exprs.append(
        samples(
            f"count_over_time({firing})",
            LAST_STEP,
            [(f'{{job="{job}", {labels}}}', n) for job, n in counts],
        )
    )
    quarter = Fraction(1, 4)
    traffic = None if with_records else cadence
    source = "traffic from records" if with_records else "an agent without records"
    return {
        "name": f"a profiled window every {cadence} min, {source}",
        "jobs": tuple(names.values()),
        "input_series": [
            s for job in JOBS for s in _job(job, names[job], cadence, cadence, traffic)
        ],
        "promql_expr_test": exprs,
        "alert_rule_test": [
            _busbw_low(10, ()),
            _busbw_low(FIRST_WINDOW + 16, (slow,)),
            _busbw_low(bad - 1, (slow,)),
            _busbw_low(bad + 14, (slow,)),
            _busbw_low(bad + 16, (slow, degrades)),
            _busbw_low(recovered + 1, (slow,)),
            _busbw_low(DROPPED + 1, ()),
            *_breakdown_alerts((slow,)),
            alerts(
                "MFUScopeExposedCommHigh",
                bad + 21,
                [({"job": slow}, quarter), ({"job": degrades}, quarter)],
            ),
            alerts("MFUScopeExposedCommHigh", good + 6, [({"job": slow}, quarter)]),
        ],
    }


def _every_step() -> Case:
    names = {job: f"{job}-every-step" for job in JOBS}
    slow, degrades = names["slow"], names["degrades"]
    exprs = _latest_figures(1, names)
    steady = f'{{job=~"{slow}|{names["healthy"]}"}}[{LAST_STEP - 1}m]'
    exprs.append(
        samples(
            f"count_over_time({EFFICIENCY}:ratio_rate5m{steady})",
            LAST_STEP,
            [(_op(names[job]), LAST_STEP) for job in ("slow", "healthy")],
        )
    )
    return {
        "name": "collectives timed on every step, a profiled window every 10 min",
        "jobs": tuple(names.values()),
        "input_series": [s for job in JOBS for s in _job(job, names[job], None, 10)],
        "promql_expr_test": exprs,
        "alert_rule_test": [
            _busbw_low(10, ()),
            _busbw_low(18, (slow,)),
            _busbw_low(DEGRADED[0] + 13, (slow,)),
            _busbw_low(DEGRADED[0] + 17, (slow, degrades)),
            _busbw_low(DEGRADED[1] + 6, (slow,)),
            _busbw_low(DROPPED + 1, ()),
            *_breakdown_alerts((slow,)),
        ],
    }


def _firing(check: Case, jobs: tuple[str, ...]) -> Case:
    """An alert check of one part as a query of the firing ALERTS series of the part's jobs:
    exactly the alerts `check` expects of them, at its minute (the annotations are checked at the
    minutes every part agrees on, `_together`)."""
    alert = check["alertname"]
    selector = f'ALERTS{{alertname="{alert}", alertstate="firing", job=~"{"|".join(jobs)}"}}'
    found = []
    for expected in check["exp_alerts"]:
        labels = {"__name__": "ALERTS", "alertname": alert, "alertstate": "firing"}
        labels |= expected["exp_labels"]
        found.append(("{" + ", ".join(f'{k}="{v}"' for k, v in labels.items()) + "}", 1.0))
    return samples(selector, int(check["eval_time"][:-1]), found)


def _together(parts: list[Case]) -> Case:
    """The parts as one test group: promtool evaluates every rule at every minute of a group, so
    five parts of 160 min cost about what one does. Each part's jobs have their own labels; its
    alert checks become queries of its jobs' ALERTS (`_firing`); the alerts with their
    annotations are checked where every part expects the same (slow firing, degrades not yet,
    nothing before the first window's alert or after the drop)."""
    every_slow = tuple(job for part in parts for job in part["jobs"] if job.startswith("slow-"))
    return {
        "name": "; ".join(part["name"] for part in parts),
        "interval": "1m",
        "input_series": [s for part in parts for s in part["input_series"]],
        "promql_expr_test": [
            *(e for part in parts for e in part["promql_expr_test"]),
            *(_firing(c, part["jobs"]) for part in parts for c in part["alert_rule_test"]),
            # No latest figure outlives the collector's drop of the jobs.
            samples(f'{{__name__=~".+:{LATEST}"}}', DROPPED + 1, []),
        ],
        "alert_rule_test": [
            _busbw_low(10, ()),
            *_breakdown_alerts(every_slow),
            _busbw_low(60, every_slow),
            _busbw_low(DROPPED + 1, ()),
        ],
    }


HEADER = """\
# Generated by tests/support/window_cadence.py (edit that, then run
# `python -m tests.support.window_cadence`). The rules and alerts fed by profiled windows, with
# counters shaped as the collector exports them: collective time that jumps at each window (a
# window every 5, 10 or 30 min) while traffic from the agents' records rises at every scrape
# (also an older agent whose traffic jumps at windows too), or everything rising at every
# scrape, step components split by the latest window, all in one test group (each part's jobs
# named after it). Jobs: "slow" (link at 10 % of spec), "healthy" (85 %), "degrades" (85 %, 10 %
# from minute 65 to 115); all end at minute 150 and are dropped by the collector at 155. Last,
# the MFU regression alert's cause with a window every 30 min.
"""


def render() -> str:
    parts = [
        *(_windowed(c) for c in CADENCES),
        _windowed(10, with_records=False),
        _every_step(),
    ]
    suite = {
        "rule_files": ["../rules/mfuscope-recording.yml", "../rules/mfuscope-alerts.yml"],
        "evaluation_interval": "1m",
        "tests": [_together(parts), regression_case()],
    }
    return HEADER + yaml.safe_dump(suite, sort_keys=False, width=10_000, allow_unicode=True)


if __name__ == "__main__":
    PATH.write_text(render(), encoding="utf-8")
