"""Measured and carried breakdowns (core/run_summary/coverage.py), and the aggregates that use only
measured steps."""

from __future__ import annotations

import pytest
from mfuscope.core.run_summary.breakdowns import decomposition_per_rank, job_waterfall
from mfuscope.core.run_summary.coverage import coverage, is_measured, rank_coverage
from mfuscope.core.run_summary.run_data import merge_batches
from mfuscope.core.schema import ComponentShare, ReportBatch, StepReport


def _step(n: int, breakdown: int | None, compute_s: float = 0.5) -> StepReport:
    return StepReport(
        step=n,
        start_unix_ns=n * 100_000_000,  # 0.1 s per step
        wall_s=1.0,
        model_flops=1e9,
        recompute_flops=0.0,
        components=()
        if breakdown is None
        else (ComponentShare("compute", compute_s), ComponentShare("bubble_idle", 1 - compute_s)),
        breakdown_step=breakdown,
    )


def _run_steps() -> list[StepReport]:
    """Steps 0-9 before any window, windows at 10-12 and 30-32, carried in between and after."""
    steps = [_step(n, None) for n in range(10)]
    steps += [_step(n, n, compute_s=0.8) for n in (10, 11, 12)]
    steps += [_step(n, 12) for n in range(13, 30)]
    steps += [_step(n, n, compute_s=0.6) for n in (30, 31, 32)]
    steps += [_step(n, 32) for n in range(33, 50)]
    return steps


def test_steps_are_told_measured_carried_or_without() -> None:
    assert is_measured(_step(10, 10)) and not is_measured(_step(11, 10))
    assert not is_measured(_step(3, None))
    got = rank_coverage(0, _run_steps())
    assert (got.windows, got.measured, got.carried, got.without) == (2, 6, 34, 10)
    assert got.latest_window_step == 32
    assert got.oldest_carried_steps == 17
    assert got.oldest_carried_s == pytest.approx(1.7)


def test_the_job_sums_ranks_and_says_so_in_words() -> None:
    batches = [
        ReportBatch(
            job="j",
            rank=rank,
            world_size=2,
            host="h",
            device="cpu",
            peak_flops=1e10,
            peak_source="user",
            sent_unix_ns=1,
            reports=tuple(_run_steps()),
        )
        for rank in (0, 1)
    ]
    run = merge_batches(batches)
    job = coverage(run)
    assert (job.windows, job.measured, job.carried, job.without) == (2, 12, 68, 20)
    assert job.describe() == (
        "2 profiled windows measured 6 steps per rank, 12 rank-steps; 68 rank-steps carry an "
        "earlier window's breakdown (up to 17 steps, 2 s old); 20 rank-steps have none (before "
        "the first window); exposed comm differed by up to 0.0 points between a rank's latest "
        "5 windows (how far a carried figure can be off)"
    )
    # The decomposition and the waterfall average measured steps only: (0.8 + 0.6) / 2.
    (rank0, _) = decomposition_per_rank(run)
    assert rank0.steps == 6 and rank0.fraction("compute") == pytest.approx(0.7)
    waterfall = job_waterfall(run)
    assert waterfall is not None and waterfall.samples == 12
