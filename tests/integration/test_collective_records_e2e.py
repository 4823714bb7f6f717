"""Always-on collective records, end to end with profiling off: a real 2-rank gloo job on a 1 x 2
(dp, tp) mesh (`tests/support/mesh_job.py`) through the real agent to a real collector.

Hand count per rank and step (WIDTH 32, HIDDEN 64, BATCH 8, fp32): on tp (n = 2) one all_reduce of
the row-parallel output, 8 x 32 x 4 B = 1024 B; on dp (a group of one rank here) one all_reduce
of each tp-local weight shard, 32 x 32 x 4 B = 4096 B, two per step. The collector sums both ranks'
6 steps; the bus factor of all_reduce is 2(n-1)/n: 1 on tp, 0 on the one-rank dp group. Every step
is checked through the agents' arrival samples: the first collective of each step on a group is
exactly one tp or two dp sequence numbers after the previous step's.
"""

from __future__ import annotations

import itertools
import json
import subprocess
from pathlib import Path

import pytest

from tests.support.collector_process import CollectorProcess
from tests.support.mesh_runs import mesh_job, scrape

pytestmark = pytest.mark.slow

STEPS = 6
RANKS = 2
PER_STEP = {("all_reduce", "tp"): (1, 1024), ("all_reduce", "dp"): (2, 4096)}  # calls, bytes each
JOB = (("job", "groups-mesh"),)


def test_every_collective_of_every_step_is_counted_with_profiling_off(tmp_path: Path) -> None:
    collector = CollectorProcess(tmp_path)
    try:
        command, env = mesh_job(
            tmp_path,
            RANKS,
            *("--layout", "mesh", "--shape", "1x2", "--no-profile", "--steps", str(STEPS)),
            *("--collector-url", collector.url, "--out", str(tmp_path)),
        )
        result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
        assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-6000:]
        names = [
            *(f"mfuscope_collective_{n}_total" for n in ("calls", "bytes", "bus_bytes")),
            *(f"mfuscope_collective_{n}_total" for n in ("seconds", "sized_seconds")),
            *(f"mfuscope_collective_{n}_total" for n in ("profiled_seconds", "overlapped_seconds")),
            "mfuscope_agent_windows_analysed_total",
            "mfuscope_last_report_age_seconds",
            "mfuscope_collective_records_lost_total",
        ]
        metrics = {
            name: {tuple(sorted(labels.items())): v for labels, v in scrape(collector.url, name)}
            for name in names
        }
    finally:
        collector.stop()

    def by_op_axis(name: str) -> dict[tuple[str, str], float]:
        return {
            (dict(labels)["op"], dict(labels)["axis"]): value
            for labels, value in metrics[name].items()
        }

    calls = by_op_axis("mfuscope_collective_calls_total")
    sent = by_op_axis("mfuscope_collective_bytes_total")
    bus = by_op_axis("mfuscope_collective_bus_bytes_total")
    assert calls == {key: RANKS * STEPS * n for key, (n, _) in PER_STEP.items()}
    assert sent == {key: RANKS * STEPS * n * size for key, (n, size) in PER_STEP.items()}
    assert bus == {("all_reduce", "tp"): sent[("all_reduce", "tp")], ("all_reduce", "dp"): 0.0}
    # Profiling was off: nothing came from windows (and gloo gives no durations).
    for name in ("profiled_seconds", "overlapped_seconds", "seconds", "sized_seconds"):
        assert set(by_op_axis(f"mfuscope_collective_{name}_total").values()) == {0.0}, name
    assert metrics["mfuscope_agent_windows_analysed_total"] == {JOB: 0.0}
    # The agents closed: the job ended normally, so no report age is exported.
    assert metrics["mfuscope_last_report_age_seconds"] == {}
    assert metrics["mfuscope_collective_records_lost_total"] == {JOB: 0.0}

    # Every step: the first collective of each step on each group, per rank.
    for rank in range(RANKS):
        batches = [
            json.loads(line)
            for line in (tmp_path / f"reports-{rank}.jsonl").read_text().splitlines()
        ]
        assert batches[-1]["closing"] is True
        groups = {g["group"]: g["axis"] for b in batches for g in b["comm"]["groups"]}
        firsts: dict[str, list[int]] = {}
        for b in batches:
            for sample in b["comm"]["arrivals"]:
                firsts.setdefault(groups[sample["group"]], []).append(sample["seq"])
        for axis, seqs in firsts.items():
            assert len(seqs) == STEPS, (rank, axis, seqs)
            step_calls = {b - a for a, b in itertools.pairwise(seqs)}
            assert step_calls == {PER_STEP[("all_reduce", axis)][0]}, (rank, axis, seqs)
