"""A hang at scale, by simulation: 1,024 ranks over 128 sidecar collectors (8 ranks each), fed by
a generator with the batches their agents would send (`tests/support/sidecar_fleet.py`: no
node-mate in any group; rank 17 stops outside any collective, the 127 other ranks of its column
group wait for it, every other rank stops blocked in nothing the recorder sees).

A fake clock drives the sidecars; every 15 s (the shipped scrape and evaluation interval) the
series the hang rules and MFUScopeCollectiveHang read are taken from every sidecar, each with its
own `instance` (a scrape with `honor_labels: true`), and promtool evaluates the shipped rules
over them. The page must go out naming rank 17, and only it, within 2 min of the stall; the hang
must make as many series as docs/fleet.md says. (`benchmarks/sidecar_hangs.py` runs the same job
against a real Prometheus in real time and measures the rules' evaluation time.)
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import yaml

from tests.integration.prometheus.conftest import PROMETHEUS_DIR
from tests.support.collector_fakes import FakeClock
from tests.support.sidecar_fleet import JOB, STALLED, Fleet

pytestmark = pytest.mark.slow  # promtool in a child process

RANKS, PER_SIDECAR, INTERVAL_S = 1024, 8, 15
STALL_S = 30  # the stall, s after the start: the scrapes up to it see nothing of the hang
SCRAPES = (STALL_S + 120) // INTERVAL_S  # up to the page deadline, 2 min after the stall
READ = (
    "mfuscope_collective_blocked_ranks",
    "mfuscope_collective_blocked_seconds",
    "mfuscope_collective_hang_suspect_seconds",
    "mfuscope_collective_hang_suspects",
    "mfuscope_collective_group_waiting_seq",
    "mfuscope_collective_group_waiting_seconds",
    "mfuscope_collective_group_entered_seq",
)


def _scrapes() -> tuple[dict[str, list[str]], list[int]]:
    """Series (promtool selector) -> its value at each scrape ('_': absent); and the count of
    series present at each scrape."""
    clock = FakeClock()
    start = clock.monotonic()
    fleet = Fleet(RANKS, PER_SIDECAR, clock, stall_at=start + STALL_S)
    series: dict[str, list[str]] = {}
    counts = []
    for scrape in range(SCRAPES):
        for _ in range(INTERVAL_S):
            clock.advance(1.0)
            fleet.send_due(clock.monotonic())
        present = 0
        for family in fleet.families(READ):
            for s in family.samples:
                labels = ", ".join(
                    f'{k}="{v}"' for k, v in zip(family.label_names, s.labels, strict=True)
                )
                values = series.setdefault(f"{family.name}{{{labels}}}", ["_"] * SCRAPES)
                values[scrape] = repr(s.value)
                present += 1
        counts.append(present)
    return series, counts


def test_a_1024_rank_hang_over_128_sidecars_pages_with_the_rank(
    promtool: str, tmp_path: Path
) -> None:
    series, counts = _scrapes()
    # Before the stall nothing of the hang exists; during it: two wait series, two blocked series
    # and a suspect count (0) for each of the 127 sidecars with a waiting rank, two progress
    # series for each of the 897 ranks that are not blocked (all of them overdue), and no suspect
    # of any collector's own (none can name rank 17): docs/fleet.md#hangs-across-sidecars.
    healthy = STALL_S // INTERVAL_S
    assert counts[:healthy] == [0] * healthy
    assert counts[-1] == 127 * 5 + 897 * 2, counts
    assert not any(name.startswith("mfuscope_collective_hang_suspect_seconds") for name in series)

    def at(seconds: int) -> str:
        return f"{seconds}s"

    page_by = STALL_S + 120
    node = f"node{STALLED // PER_SIDECAR}"
    suite = {
        "rule_files": [
            str(PROMETHEUS_DIR / "rules" / f)
            for f in ("mfuscope-recording.yml", "mfuscope-alerts.yml")
        ],
        "evaluation_interval": f"{INTERVAL_S}s",
        "tests": [
            {
                "interval": f"{INTERVAL_S}s",
                "input_series": [
                    {"series": name, "values": " ".join(["_", *values])}  # t = 0: nothing yet
                    for name, values in series.items()
                ],
                "promql_expr_test": [
                    {
                        "expr": 'ALERTS{alertname="MFUScopeCollectiveHang", alertstate="firing"}',
                        "eval_time": at(page_by),
                        "exp_samples": [
                            {
                                "labels": '{__name__="ALERTS", alertname="MFUScopeCollectiveHang",'
                                f' alertstate="firing", job="{JOB}", severity="critical"}}',
                                "value": 1,
                            }
                        ],
                    },
                    {
                        "expr": "count by (rank, node, op, seq, axis, reason) "
                        "(job_rank:mfuscope_collective_hang_suspect:seconds)",
                        "eval_time": at(page_by),
                        "exp_samples": [
                            {
                                "labels": f'{{rank="{STALLED}", node="{node}",'
                                f' op="all_reduce", seq="{2 * STALL_S + 1}", axis="dp",'
                                ' reason="not_joined"}',
                                "value": 1,
                            }
                        ],
                    },
                ],
            }
        ],
    }
    path = tmp_path / "scale_test.yml"
    path.write_text(yaml.safe_dump(suite, width=10_000), encoding="utf-8")
    result = subprocess.run(
        [promtool, "test", "rules", str(path)], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
