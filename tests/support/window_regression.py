"""The MFU regression alert's cause with a profiled window every 30 min (a case of
window_cadence_test.yml, written by window_cadence.py).

Job "r", one rank on a 1e15 FLOP/s peak, at MFU 0.4: per minute model FLOPs 2.4e16 and step
seconds 48 compute, 6 exposed_comm, 6 bubble_idle. From minute 190 its link slows it to MFU 0.28
at once (FLOPs are counted on every step), while the step breakdown changes only at the next
window: until then every step is split as before the drop, and the drop reads as
kernel_inefficiency (compute share - MFU). The cause says how old the breakdown is. A window after
the drop measures 33.75 compute, 22.5 exposed_comm, 3.75 bubble_idle, and 15 min later the slices
name exposed_comm. Quantities are sums of powers of two, exact in binary.
"""

from __future__ import annotations

from fractions import Fraction

from tests.support.window_series import (
    Case,
    Increment,
    alert_rule,
    counter,
    encode,
    first_window_from,
    latest_window,
    render,
    samples,
    series,
)

CADENCE = 30
DROP = 190
MINUTES = 241
BEFORE = {"compute": Fraction(48), "exposed_comm": Fraction(6), "bubble_idle": Fraction(6)}
AFTER = {
    "compute": Fraction(135, 4),
    "exposed_comm": Fraction(45, 2),
    "bubble_idle": Fraction(15, 4),
}
DESCRIPTIONS = {
    "warning": "Over its last 15 min of running job r reached an MFU of 28% against 40% over its "
    "running time in the 6 h before: 30% of its own useful arithmetic is gone. The same hardware "
    "is doing less model work per second.",
    "critical": "Over its last 15 min of running job r lost 30% of the MFU it sustained over its "
    "running time in the 6 h before (more than a quarter): a large share of the accelerator time "
    "being paid for no longer advances the model.",
}


def _fired(minute: int, severities: tuple[str, ...], cause: str) -> Case:
    """The regression alert of job "r", 30 % below its baseline over all of the last 15 min."""
    expected = []
    for severity in severities:
        annotations = alert_rule("MFUScopeMFURegression", severity)["annotations"]
        rendered = {
            "summary": render(annotations["summary"], {"job": "r"}, Fraction(3, 10)),
            "cause": cause,
            "description": DESCRIPTIONS[severity],
            "runbook": render(annotations["runbook"], {"job": "r"}, Fraction(3, 10)),
        }
        expected.append(
            {"exp_labels": {"severity": severity, "job": "r"}, "exp_annotations": rendered}
        )
    return {"eval_time": f"{minute}m", "alertname": "MFUScopeMFURegression", "exp_alerts": expected}


def _input() -> list[dict[str, str]]:
    def flops(m: int) -> Fraction:
        return Fraction(24 * 10**15) if m < DROP else Fraction(168 * 10**14)

    def component(name: str) -> Increment:
        def seconds(m: int) -> Fraction:
            window = latest_window(CADENCE, m)
            return Fraction(0) if window is None else (BEFORE if window < DROP else AFTER)[name]

        return seconds

    def age(m: int) -> Fraction | None:
        window = latest_window(CADENCE, m)
        return None if window is None else Fraction(60 * (m - window))

    def running(increment: Increment) -> str:
        return counter(increment, MINUTES, MINUTES - 1, stale=False)

    rows = [
        series("mfuscope_model_flops_total", 'job="r"', running(flops)),
        series(
            "mfuscope_peak_flop_seconds_total", 'job="r"', running(lambda m: Fraction(6 * 10**16))
        ),
        series("mfuscope_peak_flops", 'job="r"', encode([Fraction(10**15)] * MINUTES, False)),
        series(
            "mfuscope_breakdown_age_seconds",
            'job="r"',
            encode([age(m) for m in range(MINUTES)], False),
        ),
    ]
    for name in BEFORE:
        where = 'axis="dp", tier="inter_node"' if name == "exposed_comm" else 'axis="", tier=""'
        labels = f'job="r", component="{name}", {where}'
        rows.append(
            series("mfuscope_step_component_seconds_total", labels, running(component(name)))
        )
    return rows


def regression_case() -> Case:
    stale = latest_window(CADENCE, DROP)
    assert stale is not None
    fresh = first_window_from(CADENCE, DROP, MINUTES - 1)
    early = DROP + 17  # the warning fires; the newest window predates the drop
    late = fresh + 15  # the last 15 min all carry the breakdown of the window after the drop
    exposed = '{job="r", component="exposed_comm", axis="dp", tier="inter_node"}'
    return {
        "name": "the MFU regression's cause with a profiled window every 30 min",
        "interval": "1m",
        "input_series": _input(),
        "promql_expr_test": [
            samples(
                "round(1000 * job:mfuscope_mfu_regression:ratio)", early, [('{job="r"}', 300.0)]
            ),
            # exposed_comm 37.5 %, bubble_idle 6.25 %, kernel_inefficiency 56.25 % - 28 %. The 6 h
            # baseline now holds minutes of the drop, so only the slices' own shares are exact.
            samples(
                "round(10000 * job_component:mfuscope_waterfall_slice:ratio_increase15m)",
                late,
                [
                    (exposed, 3750.0),
                    ('{job="r", component="bubble_idle"}', 625.0),
                    ('{job="r", component="kernel_inefficiency"}', 2825.0),
                ],
            ),
            samples(
                "round(10000 * topk(1, job_component:mfuscope_waterfall_slice_growth:ratio))",
                late,
                [(exposed, 2750.0)],
            ),
        ],
        "alert_rule_test": [
            {"eval_time": f"{DROP + 13}m", "alertname": "MFUScopeMFURegression", "exp_alerts": []},
            _fired(
                early,
                ("warning",),
                "kernel_inefficiency grew most: 40% -> 52% of step time; the breakdown is from a "
                f"profiled window {early - stale}m 0s ago",
            ),
        ],
    }
