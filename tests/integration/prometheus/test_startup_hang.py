"""A rank stuck before its first step, named in both layouts: one collector for the job, and one
sidecar collector per rank behind a real Prometheus with the shipped rules.

The 4-rank gloo job on the groups of a 2 x 2 (dp, tp) mesh of `tests/support/mesh_job.py`
(`mesh_groups`), one rank per "node", stops rank 2 at the start of step 0: before its first
collective on its dp and tp groups (as a rank stuck in its start-up, or in NCCL's set-up at a
group's first collective, would), and before it ever reported a step. Its peers wait in their
first dp or tp all_reduce. One job is watched in both layouts at once: each rank's batches go,
unchanged, to the job's one collector and to the rank's own sidecar (`ReportTee`). Rank 2's agent
reports its groups from its start, with nothing entered in them; the one collector's join names
rank 2; rank 2's sidecar sees nobody blocked and exports its progress once it is overdue (from its
first report: it has no step), and the rules join it with the waiters' sidecars, while no sidecar
names anyone from its own ranks. Both must name rank 2 and no other rank: never joined its dp
group's first all_reduce or the tp all_reduce its tp peer waits in (each layout names it under
the wait it picks: the rules under the longest).
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.integration.prometheus.conftest import PrometheusServer, wait_for
from tests.support.mesh_runs import ReportTee, mesh_job, scrape, start_collectors
from tests.support.processes import stop

pytestmark = pytest.mark.slow

RANKS, STALL_RANK = 4, 2
SUSPECTS = "job_rank:mfuscope_collective_hang_suspect:seconds"


def _stalled_job(home: Path, urls: list[str]) -> tuple[subprocess.Popen[bytes], Path]:
    """Start the job; return it once rank 2 has stopped, and the file that lets it go on."""
    resume = home / "resume"
    command, env = mesh_job(
        home,
        RANKS,
        *("--layout", "mesh_groups", "--shape", "2x2", "--no-profile", "--steps", "2"),
        *("--stall-rank", str(STALL_RANK), "--stall-step", "0", "--resume-file", str(resume)),
        *("--out", str(home), "--node-per-rank", "--collector-url", ",".join(urls)),
        # Rank 2 has no step to report: its first batch is a status, one status interval after
        # its agent starts (10 s by default), and it is overdue OVERDUE_AFTER_S after that.
        *("--read-interval", "0.5", "--status-interval", "2"),
    )
    with (home / "job.log").open("wb") as log:
        job = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT)
    wait_for(lambda: (home / "stall.json").exists() or job.poll() is not None, 240, "the stop")
    assert job.poll() is None, (home / "job.log").read_text()[-4000:]
    return job, resume


def _named(samples: list[dict[str, str]]) -> set[tuple[str, str, str]]:
    return {(s["rank"], s["reason"], s["axis"]) for s in samples}


def test_a_rank_stuck_before_its_first_step_is_named_by_one_collector_and_by_sidecars(
    tmp_path: Path, start_prometheus: Callable[..., PrometheusServer]
) -> None:
    expected = [{(str(STALL_RANK), "not_joined", axis)} for axis in ("dp", "tp")]
    processes, (one, *sidecars) = start_collectors(tmp_path, 1 + RANKS)
    tee: ReportTee | None = None
    job: subprocess.Popen[bytes] | None = None
    try:
        prometheus = start_prometheus(sidecars)
        # Rank r's batches: to the one collector, and to its own sidecar.
        tee = ReportTee([[f"http://{one}", f"http://{sidecar}"] for sidecar in sidecars])
        job, resume = _stalled_job(tmp_path, tee.urls)

        def one_names() -> set[tuple[str, str, str]]:
            found = scrape(f"http://{one}", "mfuscope_collective_hang_suspect_seconds")
            return _named([labels for labels, _ in found])

        def sidecars_name() -> bool:
            suspects = "mfuscope_collective_hang_suspect_seconds"
            return any(scrape(f"http://{sidecar}", suspects) for sidecar in sidecars)

        def rule_names() -> set[tuple[str, str, str]]:
            return _named([s["metric"] for s in prometheus.samples(SUSPECTS)])

        wait_for(lambda: bool(one_names()), 120, "the one collector to name a rank")
        assert one_names() in expected
        # The waiters are blocked by now; no sidecar can name rank 2 from its own ranks.
        assert not sidecars_name()
        wait_for(lambda: bool(rule_names()), 120, "the rules to name a rank")
        assert rule_names() in expected
        assert not sidecars_name()
        resume.write_text("go")
        assert job.wait(120) == 0, (tmp_path / "job.log").read_text()[-4000:]
    finally:
        if job is not None and job.poll() is None:
            job.kill()
            job.wait(30)
        if tee is not None:
            tee.close()
        for process in processes:
            stop(process)
