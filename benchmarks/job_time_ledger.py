"""The job-time ledger against the job's own clock (docs/definitions.md#job-time-ledger).

    python benchmarks/job_time_ledger.py            # one run, about a minute on 2 idle cores
    python benchmarks/job_time_ledger.py --runs 3

A real collector and a 2-rank gloo job under torchrun (`tests/support/ledger_job.py`, the scenario
of `tests/support/ledger_truth.py`): rank 1 fails after step 19 of the first launch, a second
launch resumes from the checkpoint of step 16 and runs to step 29; checkpoint saves every 8 steps,
evaluations every 12 and after the last step, a 1 s startup of its own besides the imports. The
job times its own processes (start from /proc, every step and phase, its end) and the truth side
applies the definitions to those readings. Printed per category: the job's figure, the ledger's
(the collector's `mfuscope_job_rank_seconds_total`), and the difference as a share of the job's
rank-seconds; then rank-seconds and effective MFU on both sides. The suite's test
(tests/integration/test_job_time_ledger.py) holds each category to 2 % and effective MFU to 1 %.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from tests.support.collector_process import CollectorProcess  # noqa: E402
from tests.support.ledger_truth import (  # noqa: E402
    Scenario,
    collector_figures,
    run_scenario,
    truth_figures,
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=1)
    args = parser.parse_args()
    scenario = Scenario()
    worst = 0.0
    for run in range(args.runs):
        with tempfile.TemporaryDirectory() as home:
            out = Path(home)
            collector = CollectorProcess(out)
            try:
                wall = run_scenario(out, collector.url, scenario)
                truth = truth_figures(out, scenario)
                ledger = collector_figures(collector.url, scenario.job)
            finally:
                collector.stop()
        print(f"run {run + 1}: both launches took {wall:.1f} s")
        print(f"  {'category':<16} {'job clock s':>12} {'ledger s':>10} {'diff / rank-s':>14}")
        for category, seconds in truth.seconds.items():
            diff = (ledger.seconds[category] - seconds) / truth.rank_seconds
            worst = max(worst, abs(diff))
            measured = ledger.seconds[category]
            print(f"  {category:<16} {seconds:12.3f} {measured:10.3f} {diff:+14.4%}")
        rank_diff = ledger.rank_seconds / truth.rank_seconds - 1
        mfu_diff = ledger.effective_mfu / truth.effective_mfu - 1
        print(
            f"  rank-seconds     {truth.rank_seconds:12.3f} {ledger.rank_seconds:10.3f} "
            f"{rank_diff:+14.4%} (relative)"
        )
        print(
            f"  effective MFU    {truth.effective_mfu:12.5f} {ledger.effective_mfu:10.5f} "
            f"{mfu_diff:+14.4%} (relative)"
        )
    print(f"largest category difference: {worst:.4%} of the job's rank-seconds (limit 2 %)")


if __name__ == "__main__":
    main()
