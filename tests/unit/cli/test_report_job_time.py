"""The report's summary lines (`mfuscope report`, the end of `mfuscope demo`) say where the ranks'
time went and the effective MFU beside the steps' MFU, from the agents' ledger."""

from __future__ import annotations

from mfuscope.cli.report.summary import describe_run, job_time_line
from mfuscope.cli.report.writer import build_content
from mfuscope.core.ledger import LedgerTotals
from mfuscope.core.run_summary.run_data import merge_batches
from mfuscope.core.schema import ReportBatch, StepReport


def _batch(rank: int, ledger: LedgerTotals | None) -> ReportBatch:
    return ReportBatch(
        job="job-a",
        rank=rank,
        world_size=2,
        host="node-0",
        device="cpu",
        peak_flops=1e10,
        peak_source="user",
        sent_unix_ns=rank,
        reports=tuple(StepReport(s, s * 10**9, 1.0, 5e9) for s in range(6)),
        ledger=ledger,
    )


def test_the_summary_lines_carry_the_job_time_and_effective_mfu() -> None:
    ledger = LedgerTotals(process_start_unix_ns=1, startup_ns=3 * 10**9, checkpoint_save_ns=10**9)
    content = build_content(merge_batches([_batch(0, ledger), _batch(1, ledger)]))
    lines = describe_run(content)
    assert "MFU 50.0%" in lines[1] and "effective MFU 30.0% over every rank-second" in lines[1]
    assert lines[2] == (
        "  job time: 20.0 rank-seconds: step 60.0%, startup 30.0%, checkpoint_save 10.0%; "
        "effective MFU 30.0% (useful model FLOPs over the peak x every rank-second)"
    )


def test_without_a_ledger_there_is_no_job_time_line() -> None:
    content = build_content(merge_batches([_batch(0, None)]))
    assert job_time_line(content) is None
    assert not any("effective" in line for line in describe_run(content))
