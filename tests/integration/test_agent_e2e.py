"""End to end: a real 2-rank gloo torchrun job (DDP, checkpointed layers) running the agent into
a JSONL file and into a collector stub on port 0, with sampled profiler windows analysed live."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from mfuscope.core.run_key import fingerprint
from mfuscope.core.schema import ReportBatch, StepReport, decode_batch

from tests.support import agent_helpers as helpers

# The last step must carry a window's breakdown: the first window's analysis (a child process)
# has to land before it. 16 steps left ~1.8 s for that, which one loaded CI run missed; 30 leave
# ~4 s.
STEPS = 30


def _by_rank(batches: list[ReportBatch]) -> dict[int, dict[int, StepReport]]:
    ranks: dict[int, dict[int, StepReport]] = {}
    for batch in batches:
        for report in batch.reports:
            ranks.setdefault(batch.rank, {})[report.step] = report
    return ranks


@pytest.mark.slow
def test_two_rank_job_reports_live_mfu_and_decomposition(tmp_path: Path) -> None:
    stub = helpers.StubCollector()
    jsonl = tmp_path / "reports.jsonl"
    try:
        result = helpers.run_job(
            tmp_path,
            "--steps", str(STEPS),
            "--jsonl", str(jsonl),
            "--collector-url", stub.url,
            "--times", str(tmp_path / "times{rank}.json"),
            "--option", "profile_first_step=3",
            "--option", "profile_steps=2",
            "--option", "profile_every_steps=6",
            "--option", "profile_max_overhead_ratio=1",
            "--option", "flush_interval_s=0.5",
            "--close-timeout-s", "60",  # returns as soon as done; room for a loaded machine
            torchrun=True,  # the main e2e runs the way users launch: under real torchrun
        )  # fmt: skip
    finally:
        stub.close()
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    file_batches = [decode_batch(line) for line in jsonl.read_text().splitlines()]
    assert stub.errors == []

    # Both sinks got every step of both ranks, exactly the same reports.
    from_file, from_stub = _by_rank(file_batches), _by_rank(stub.batches)
    assert sorted(from_file) == [0, 1]
    assert from_file == from_stub
    for rank, reports in from_file.items():
        assert sorted(reports) == list(range(STEPS)), rank

    last = {b.rank: b for b in file_batches}
    for rank, batch in last.items():
        assert batch.world_size == 2 and batch.device == "cpu"
        assert batch.peak_source == "measured" and batch.peak_flops is not None
        # windows at steps 3-4 and then 6 steps after the previous one started, unless its
        # analysis is still running then (a loaded machine): at least the first one
        assert batch.health.windows_analysed_total >= 1, batch.health
        assert batch.health.profiler_failures_total == 0
        assert batch.health.reports_dropped_total == 0
        assert batch.topology is not None
        assert [(g.axis, g.tier, g.size) for g in batch.topology.groups] == [
            ("world", "intra_node", 2)
        ]
        peak = batch.peak_flops
        reports = from_file[rank].values()
        # The run key: the fingerprint of this workload, the same on both ranks.
        flops = next(r.model_flops for r in reports if r.model_flops > 0)
        assert batch.run_key == fingerprint(flops, 2, [("world", 2)], "cpu", "fp32")
        for report in reports:
            mfu = report.model_flops / (peak * report.wall_s)
            hfu = report.hardware_flops / (peak * report.wall_s)
            assert 0 < mfu <= hfu, (rank, report.step)
            assert report.recompute_flops > 0
            if report.components:
                total = math.fsum(c.seconds for c in report.components)
                assert math.isclose(total, report.wall_s, rel_tol=1e-9)
        profiled = [r for r in reports if r.collectives]
        assert {r.step for r in profiled} >= {3, 4}
        for report in profiled:
            assert report.breakdown_step == report.step
            ops = {(c.op, c.axis, c.tier, c.group_size) for c in report.collectives}
            assert ops == {("all_reduce", "world", "intra_node", 2)}
            assert all(c.bytes and c.bytes > 0 for c in report.collectives)
        with_breakdown = [r for r in reports if r.components]
        components = {c.component for r in with_breakdown for c in r.components}
        assert {"compute", "recompute", "exposed_comm"} <= components
        exposed_axes = {
            (c.axis, c.tier)
            for r in with_breakdown
            for c in r.components
            if c.component == "exposed_comm"
        }
        assert ("world", "intra_node") in exposed_axes
        assert any(r.overlapped_comm_s > 0 for r in with_breakdown)
        # later steps carry the latest window's breakdown
        assert from_file[rank][STEPS - 1].breakdown_step in {r.step for r in profiled}
        times = json.loads((tmp_path / f"times{rank}.json").read_text())
        assert times["health"]["internal_errors"] == 0
        # With several ranks (the window agreement and the flight-recorder reader on the
        # periodic thread): the periodic thread, the analyser, one transport per sink (two here).
        assert times["threads"] == [
            "mfuscope-analyser",
            "mfuscope-periodic",
            f"mfuscope-transport(collector {stub.url})",
            f"mfuscope-transport(file {jsonl})",
        ]
    # every profiled trace was deleted
    assert list((tmp_path / "tmp").glob("mfuscope-window-*")) == []
