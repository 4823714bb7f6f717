"""A real hang, attributed and paged: a 4-rank gloo job on the groups of a 2 x 2 (dp, tp) mesh with
profiling off (`tests/support/mesh_job.py`, `mesh_groups`) feeds a real collector, which a real
Prometheus scrapes every second with the project's rules, MFUScopeCollectiveHang paging after
`PAGE_AFTER_S` of waiting instead of 60 s (the shipped threshold is checked by promtool,
deploy/prometheus/tests/hangs_test.yml).

Rank 2 stops at the start of step 4, before its first collective, until the test lets it go. Its
tp peer (rank 3) then waits in the forward all_reduce of their tp group, rank 0 in the gradient
all_reduce of its dp group with rank 2, and rank 1 in its dp all_reduce with rank 3 (a victim: rank
3 waits for rank 2). The collector must name rank 2 alone, with the op, the group's axis and the
sequence number rank 2 would enter next (which rank 2 counts from its own recorder before it
stops; how soon follows from thresholds checked on scripted time); MFUScopeCollectiveHang must
fire through the shipped rules with that cause; once rank 2 resumes the hang series must clear.
At the end the collective counters
must equal the hand count of the job's collectives, every step: per rank and step one tp
all_reduce of 1024 B and two dp all_reduces of 4096 B (derived in
`tests/integration/test_group_axes_e2e.py`).
"""

from __future__ import annotations

import json
import subprocess
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.support.mesh_runs import hang_rule_files, mesh_job, scrape

pytestmark = pytest.mark.slow

RANKS, STEPS, STALL_RANK, STALL_STEP = 4, 8, 2, 4
# Ranks count as blocked after core.hangs.BLOCKED_AFTER_S (10 s): the page follows 5 s later.
PAGE_AFTER_S = 15
JOB = "groups-mesh_groups"
PER_STEP = {("all_reduce", "tp"): (1, 1024), ("all_reduce", "dp"): (2, 4096)}  # calls, bytes each


def _firing(prometheus: Any) -> list[dict[str, Any]]:
    with urllib.request.urlopen(prometheus.url + "/api/v1/alerts", timeout=10) as response:
        alerts: list[dict[str, Any]] = json.load(response)["data"]["alerts"]
    return [
        a
        for a in alerts
        if a["labels"]["alertname"] == "MFUScopeCollectiveHang" and a["state"] == "firing"
    ]


def test_a_rank_that_stops_is_named_paged_and_cleared(
    collector: Any, start_prometheus: Callable[..., Any], tmp_path: Path, wait_until: Any
) -> None:
    rules = hang_rule_files(tmp_path / "rules", PAGE_AFTER_S)
    prometheus = start_prometheus([collector.address], rule_files=rules)
    resume = tmp_path / "resume"
    command, env = mesh_job(
        tmp_path,
        RANKS,
        *("--layout", "mesh_groups", "--shape", "2x2", "--no-profile", "--steps", str(STEPS)),
        *("--stall-rank", str(STALL_RANK), "--stall-step", str(STALL_STEP)),
        *("--resume-file", str(resume), "--collector-url", collector.url, "--out", str(tmp_path)),
    )
    log = (tmp_path / "job.log").open("w")
    job = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        stall = tmp_path / "stall.json"
        wait_until(lambda: stall.exists() or job.poll() is not None, 240, "rank 2 to stop")
        assert job.poll() is None, (tmp_path / "job.log").read_text()[-4000:]
        next_seq = {
            desc.removeprefix("mesh_"): seq for desc, seq in json.loads(stall.read_text()).items()
        }

        def suspects() -> list[tuple[dict[str, str], float]]:
            return scrape(collector.url, "mfuscope_collective_hang_suspect_seconds")

        # How soon after the stall it is named follows from the thresholds, checked on scripted
        # time in tests/unit/core/test_hangs.py; here only that it is, and whom.
        wait_until(lambda: bool(suspects()), 240, "the collector to name a suspect")

        # The other ranks block one after another (a rank blocks when it reaches a collective
        # the stalled rank's peers wait in), so a suspect can be named before the last blocks:
        # under another wait than the one it is named under once all wait (the page's), or, on a
        # loaded machine, a rank not yet seen blocked (rank 3 once, in a clean-clone CI run).
        # Whom the page names is read once every other rank waits.
        def blocked() -> float:
            return sum(v for _, v in scrape(collector.url, "mfuscope_collective_blocked_ranks"))

        wait_until(lambda: blocked() == RANKS - 1, 60, "every other rank to block")
        ((labels, _waited),) = suspects()
        assert labels["rank"] == str(STALL_RANK) and labels["reason"] == "not_joined"
        assert labels["op"] == "all_reduce" and labels["axis"] in next_seq
        assert labels["seq"] == str(next_seq[labels["axis"]]), (labels, next_seq)
        assert labels["node"] and labels["host"] and labels["tier"] == "intra_node"

        wait_until(lambda: bool(_firing(prometheus)), 240, "MFUScopeCollectiveHang to fire")
        (alert,) = _firing(prometheus)
        assert alert["labels"]["job"] == JOB and alert["labels"]["severity"] == "critical"
        cause = alert["annotations"]["cause"]
        expected = (
            f"rank {STALL_RANK} (node {labels['node']}) never joined all_reduce "
            f"#{labels['seq']} on {labels['axis']}/intra_node; {RANKS - 1} ranks waiting "
        )
        assert cause.startswith(expected), cause

        resume.write_text("go")
        wait_until(
            lambda: (
                not suspects() and not scrape(collector.url, "mfuscope_collective_blocked_ranks")
            ),
            120,
            "the hang series to clear",
        )
        assert job.wait(timeout=300) == 0, (tmp_path / "job.log").read_text()[-4000:]
    finally:
        resume.write_text("go")
        if job.poll() is None:
            job.kill()
        job.wait(timeout=60)  # reaped here, not by a later test's garbage collection
        log.close()

    calls = {
        (labels["op"], labels["axis"]): value
        for labels, value in scrape(collector.url, "mfuscope_collective_calls_total")
    }
    sent = {
        (labels["op"], labels["axis"]): value
        for labels, value in scrape(collector.url, "mfuscope_collective_bytes_total")
    }
    assert calls == {key: RANKS * STEPS * n for key, (n, _) in PER_STEP.items()}
    assert sent == {key: RANKS * STEPS * n * size for key, (n, size) in PER_STEP.items()}
    assert not scrape(collector.url, "mfuscope_collective_hang_suspect_seconds")
