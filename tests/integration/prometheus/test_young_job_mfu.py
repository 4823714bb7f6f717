"""The dashboards' MFU panels read right in a job's first minute, on a real Prometheus.

Two synthetic ranks push step reports to a real collector in real time (one batch per rank per
second, steps of 0.5 s at an MFU of 0.4 by the agents' own figure: model FLOPs / (peak x wall)).
Prometheus scrapes every second with the project's rules. 10 s after the job's first report (ten
scrapes, a thirtieth of the panels' 5 min windows) every MFU panel must read within 10 % of 0.4.
The former formula (FLOP rate over 5 min / peak FLOP/s) reads about 10/300 of it at that age: it
is checked too, so the test shows what it guards.
"""

from __future__ import annotations

import json
import time
import urllib.request
from collections.abc import Callable
from typing import Any

import pytest

from tests.support.collector_fakes import batch_dict, report_dict

pytestmark = pytest.mark.slow

JOB = "young"
PEAK_FLOPS = 1e12
STEP_S = 0.5
MFU = 0.4
AGE_S = 10.0
# (dashboard, panel title, refId) of every panel that shows the MFU itself.
MFU_PANELS = {
    ("mfuscope-fleet", "Fleet MFU (5 min)", "A"),
    ("mfuscope-fleet", "MFU per job now", "A"),
    ("mfuscope-fleet", "MFU per job", "A"),
    ("mfuscope-job", "MFU (5 min)", "A"),
    ("mfuscope-job", "MFU and HFU", "A"),
    ("mfuscope-job", "MFU waterfall: where 1 - MFU goes (5 min)", "A"),
}


def _post(url: str, batch: dict[str, Any]) -> None:
    request = urllib.request.Request(
        f"{url}/v1/reports",
        data=json.dumps(batch).encode(),
        headers={"Content-Type": "application/json"},
        method="POST",
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        assert response.status == 200


def _run_job(url: str, seconds: float) -> None:
    """Both ranks report the steps that finished in each second, for `seconds`."""
    steps_per_s = round(1 / STEP_S)
    start = time.monotonic()
    step = 0
    for second in range(int(seconds)):
        time.sleep(max(start + second + 1 - time.monotonic(), 0))
        reports = [
            report_dict(s, wall_s=STEP_S, model_flops=MFU * PEAK_FLOPS * STEP_S)
            for s in range(step, step + steps_per_s)
        ]
        step += steps_per_s
        for rank in (0, 1):
            _post(url, batch_dict(job=JOB, rank=rank, peak_flops=PEAK_FLOPS, reports=reports))


def test_mfu_panels_read_right_ten_seconds_into_a_job(
    collector: Any,
    start_prometheus: Callable[..., Any],
    dashboard_and_rule_promql: Callable[[str], list[Any]],
) -> None:
    prometheus = start_prometheus([collector.address])
    prometheus.wait_scraping_collector()
    _run_job(collector.url, AGE_S)

    panels = {
        (s.origin.split(" / ")[0], *s.origin.split(" / ")[1:]): s.expr
        for s in dashboard_and_rule_promql(JOB)
        if s.kind == "panel"
    }
    readings = {}
    for key in sorted(MFU_PANELS):
        samples = prometheus.samples(panels[key])
        assert len(samples) == 1, (key, samples)
        readings[key] = float(samples[0]["value"][1])
    wrong = {key: value for key, value in readings.items() if abs(value / MFU - 1) > 0.10}
    assert not wrong, f"MFU panels {AGE_S:.0f} s into a job at MFU {MFU}: {wrong}"

    # What the panels read before the MFU moved to peak FLOP-seconds: the FLOPs of AGE_S spread
    # over the 5 min window.
    (old,) = prometheus.samples(
        f'sum(rate(mfuscope_model_flops_total{{job="{JOB}"}}[5m]))'
        f' / sum(mfuscope_peak_flops{{job="{JOB}"}})'
    )
    assert float(old["value"][1]) < 0.5 * MFU, old
