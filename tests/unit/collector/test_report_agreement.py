"""The report counts what the collector counts: the same steps, re-runs, duplicates, restarts and
straggler ratios from the same batches (one idempotency key, `(job, incarnation, rank, step)`;
one straggler definition, `core.stragglers`)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from mfuscope.collector import Aggregator, StateConfig
from mfuscope.collector.app import CollectorConfig
from mfuscope.core.ledger import LedgerTotals
from mfuscope.core.run_summary.rank_pace import straggler_view
from mfuscope.core.run_summary.run_data import merge_batches
from mfuscope.core.schema import ComponentShare, ReportBatch, StepReport
from mfuscope.core.stragglers import DEFAULT_WINDOW_STEPS, STRAGGLER_MIN_RATIO

from tests.support.collector_fakes import FakeClock

ALERTS = Path(__file__).resolve().parents[3] / "deploy" / "prometheus" / "rules"


def _step(n: int, compute_s: float, *, measured: bool = True) -> StepReport:
    return StepReport(
        step=n,
        start_unix_ns=n * 1_000_000_000,
        wall_s=1.0,
        model_flops=1e9,
        recompute_flops=0.0,
        components=(
            ComponentShare("compute", compute_s),
            ComponentShare("exposed_comm", 1.0 - compute_s, "dp", "intra_node"),
        ),
        breakdown_step=n if measured else max(n - 5, 0),
    )


def _batch(rank: int, incarnation: str, sent: int, steps: list[StepReport]) -> ReportBatch:
    # Each launch's processes start 100 s apart and grow their startup with every batch.
    ledger = LedgerTotals(
        process_start_unix_ns=(100 if incarnation == "b" else 0) * 1_000_000_000,
        startup_ns=sent * 1_000_000_000,
        evaluation_ns=rank * 250_000_000,
    )
    return ReportBatch(
        job="job-a",
        rank=rank,
        world_size=2,
        host="node-0",
        device="cpu",
        peak_flops=1e11,
        peak_source="user",
        sent_unix_ns=sent,
        reports=tuple(steps),
        incarnation=incarnation,
        ledger=ledger,
    )


def _restarted_job() -> list[ReportBatch]:
    """Two ranks; launch "a" runs steps 0-29 (re-sending steps 10-19 once), crashes; launch "b"
    resumes from step 20 and runs 20-44, with a profiled window's reports arriving late."""
    batches = []
    for rank in (0, 1):
        compute = 0.5 if rank == 0 else 0.56
        batches += [
            _batch(rank, "a", 1, [_step(n, compute) for n in range(0, 20)]),
            _batch(rank, "a", 2, [_step(n, compute) for n in range(10, 30)]),  # re-sent
            _batch(rank, "b", 3, [_step(n, compute, measured=False) for n in range(20, 40)]),
            _batch(rank, "b", 4, [_step(n, compute) for n in range(42, 45)]),
            _batch(rank, "b", 5, [_step(n, compute + 0.3 * rank) for n in range(40, 42)]),  # late
        ]
    return batches


def test_the_report_counts_steps_reruns_and_restarts_as_the_collector_does() -> None:
    batches = _restarted_job()
    collector = Aggregator(StateConfig(), clock=FakeClock())
    for batch in batches:
        collector.apply(batch)
    (job,) = collector.snapshot().jobs
    run = merge_batches(batches)
    assert run.launches.step_reports == sum(t.steps for t in job.totals) == 2 * (30 + 25)
    assert run.launches.rerun_steps == sum(t.reruns for t in job.totals) == 2 * 10
    assert run.launches.duplicates == sum(t.duplicates for t in job.totals) == 2 * 10
    assert run.launches.restarts == job.restarts == 1
    assert run.step_reports == run.launches.step_reports
    assert run.step_count == 45  # distinct step numbers


def test_the_report_books_the_collectors_job_time_and_effective_mfu() -> None:
    batches = _restarted_job()
    collector = Aggregator(StateConfig(), clock=FakeClock())
    for batch in batches:
        collector.apply(batch)
    (totals,) = collector.snapshot().jobs[0].totals
    time = merge_batches(batches).job_time
    assert time.seconds == totals.time_seconds
    assert time.useful_model_flops == totals.useful_model_flops == 2 * 45 * 1e9
    assert time.peak_flop_seconds == pytest.approx(totals.time_peak_flop_seconds)
    seconds = dict(zip(("startup", "step", "redone_step"), time.seconds, strict=False))
    assert seconds == {"startup": 2 * (2 + 5), "step": 2 * 45, "redone_step": 2 * 10}
    assert time.effective_mfu == pytest.approx(90e9 / (1e11 * time.rank_seconds))


def test_the_report_gives_the_collectors_straggler_ratio() -> None:
    batches = _restarted_job()
    collector = Aggregator(StateConfig(straggler_top=2), clock=FakeClock())
    for batch in batches:
        collector.apply(batch)
    (job,) = collector.snapshot().jobs
    view = straggler_view(merge_batches(batches))
    assert job.straggler_basis == view.basis == "self"
    assert [(s.rank, s.ratio) for s in view.stragglers] == [
        (s.rank, s.ratio) for s in job.stragglers
    ]


def test_one_window_size_and_threshold_everywhere() -> None:
    assert StateConfig().window_steps == CollectorConfig().window_steps == DEFAULT_WINDOW_STEPS
    alerts = (ALERTS / "mfuscope-alerts.yml").read_text()
    (threshold,) = re.findall(r"\(mfuscope_straggler_ratio\) > ([0-9.]+)", alerts)
    assert float(threshold) == pytest.approx(STRAGGLER_MIN_RATIO)
