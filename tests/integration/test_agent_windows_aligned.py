"""A real 2-rank gloo job through the real agent: every rank profiles the same steps, window
after window, although rank 1's windows cost more than rank 0's (its analyses burn extra CPU), so
each rank alone would space its windows differently (the schedule is agreed on the job's store,
docs/agent.md "Profiled windows")."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
from mfuscope.core.schema import decode_batch

from tests.support import agent_helpers as helpers

pytestmark = pytest.mark.slow

STEPS = 70


def profiled_steps(jsonl: Path) -> dict[int, list[int]]:
    """Rank -> the steps whose report carries their own decomposition (the profiled steps)."""
    steps: dict[int, set[int]] = {}
    for line in jsonl.read_text().splitlines():
        batch = decode_batch(line)
        for report in batch.reports:
            if report.breakdown_step == report.step:
                steps.setdefault(batch.rank, set()).add(report.step)
    return {rank: sorted(found) for rank, found in steps.items()}


def windows_of(steps: list[int]) -> list[int]:
    """The first step of each run of consecutive steps (a window)."""
    return [s for i, s in enumerate(steps) if i == 0 or steps[i - 1] != s - 1]


def test_every_rank_profiles_the_same_steps(tmp_path: Path) -> None:
    jsonl = tmp_path / "reports{rank}.jsonl"
    result = helpers.run_job(
        tmp_path,
        "--steps", str(STEPS),
        "--first-step", "100",  # a job resumed from the checkpoint of step 100
        "--jsonl", str(jsonl),
        "--times", str(tmp_path / "times{rank}.json"),
        "--option", "profile_first_step=3",
        "--option", "profile_steps=2",
        "--option", "profile_every_steps=8",
        # a 50% budget: the measured window costs (rank 1's 0.2 s higher) set the gaps
        "--option", "profile_max_overhead_ratio=0.5",
        "--burn-analysis-s", "0.2",
        # Steps of a few ms leave a follower one step to fetch each decision off its training
        # thread; on a loaded 2-core machine its thread can wait longer than that to run, and the
        # rank then rightly skips that window (the late path is unit-tested). Steps of 50 ms or
        # more, like any real training step, give the fetch its time.
        "--step-sleep-s", "0.05",
        "--option", "calibrate_cpu_peak=0",
        "--option", "peak_flops=1e12",
        "--option", "flush_interval_s=0.5",
        "--close-timeout-s", "60",
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    by_rank = {
        rank: profiled_steps(Path(str(jsonl).replace("{rank}", str(rank))))[rank] for rank in (0, 1)
    }
    assert by_rank[0] == by_rank[1], by_rank
    windows = windows_of(by_rank[0])
    assert len(windows) >= 3, by_rank
    assert windows[0] == 103  # profile_first_step after the resumed first step
    # whole 2-step windows (the last may be cut short by the end of the run)
    assert all(len([s for s in by_rank[0] if w <= s < w + 2]) == 2 for w in windows[:-1])
    # the gaps are at least the cadence (8 steps); the budget lengthens them here
    assert all(b - a >= 8 for a, b in itertools.pairwise(windows)), windows
