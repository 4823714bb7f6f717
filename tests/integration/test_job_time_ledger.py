"""The job-time ledger against the job's own clock: a 2-rank gloo job under torchrun whose second
rank fails mid-run on the first launch; a second launch resumes from the last checkpoint and redoes
the steps since. The job times its own startup, steps, checkpoint saves and load and evaluations
(`tests/support/ledger_job.py`); the collector's `mfuscope_job_rank_seconds_total` must give each
category within 2 % of the job's rank-seconds of the job's own figure, sum to the ranks'
rank-seconds, and effective MFU must be useful FLOPs / (peak x rank-seconds) within 1 %.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.collector_process import CollectorProcess
from tests.support.ledger_truth import Scenario, collector_figures, run_scenario, truth_figures

pytestmark = pytest.mark.slow

# Every category of the ledger in as little job as shows it (the benchmark runs the longer default
# scenario): a checkpoint every 4 steps (after steps 3 and 7), an evaluation after step 5, 11 and
# the last step, rank 1 failing after step 9 on the first launch. Phases of 0.2 s and steps of
# 0.05 s stay far above the clocks' resolution: the ledger agrees with the job's own clock to
# milliseconds, against a tolerance of 2 % of the job's tens of rank-seconds.
SCENARIO = Scenario(
    steps=12,
    exit_after=9,
    step_s=0.05,
    save_every=4,
    save_s=0.2,
    load_s=0.2,
    eval_every=6,
    eval_s=0.2,
    startup_s=0.2,
)


@pytest.fixture
def collector(tmp_path: Path) -> Iterator[CollectorProcess]:
    process = CollectorProcess(tmp_path)
    yield process
    process.stop()


def test_every_category_matches_the_jobs_own_clock(
    collector: CollectorProcess, tmp_path: Path
) -> None:
    scenario = SCENARIO
    run_scenario(tmp_path, collector.url, scenario)
    truth = truth_figures(tmp_path, scenario)
    ledger = collector_figures(collector.url, scenario.job)
    # The scenario has every kind of time it is about (hung is 0 on both sides: no rank waits
    # 10 s in a collective), and redoes steps 8-9 on both ranks (the checkpoint before step 8,
    # the failure after step 9) and step 10 on rank 0 (the step its peer's exit failed).
    for category in ("startup", "step", "redone_step", "checkpoint_save", "checkpoint_load"):
        assert truth.seconds[category] > 0, category
    assert truth.seconds["evaluation"] > 0 and truth.seconds["down"] > 0
    for category, seconds in truth.seconds.items():
        assert abs(ledger.seconds[category] - seconds) <= 0.02 * truth.rank_seconds, (
            category,
            ledger.seconds,
            truth.seconds,
        )
    assert ledger.rank_seconds == pytest.approx(truth.rank_seconds, rel=0.01)
    assert ledger.effective_mfu == pytest.approx(truth.effective_mfu, rel=0.01)
    # Effective MFU is useful FLOPs over the peak x every rank-second of the job.
    assert ledger.effective_mfu == pytest.approx(
        ledger.useful_flops / (scenario.peak_flops * ledger.rank_seconds), rel=1e-9
    )
