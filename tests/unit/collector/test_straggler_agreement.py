"""The report and the collector's straggler alert name the same slow rank on the same input."""

from __future__ import annotations

import pytest
from mfuscope.collector import Aggregator, StateConfig
from mfuscope.core.run_summary.rank_pace import straggler_view
from mfuscope.core.run_summary.run_data import merge_batches
from mfuscope.core.schema import ComponentShare, ReportBatch, StepReport

from tests.support.collector_fakes import FakeClock

WALL_S = 1.0  # synchronous ranks: every rank's step takes the same wall time


def _step(n: int, parts: dict[str, float]) -> StepReport:
    components = [ComponentShare(c, s) for c, s in parts.items() if c != "exposed_comm"]
    components.append(ComponentShare("exposed_comm", parts["exposed_comm"], "dp", "intra_node"))
    return StepReport(
        step=n,
        start_unix_ns=n * 1_000_000_000,
        wall_s=WALL_S,
        model_flops=1e9,
        recompute_flops=0.0,
        components=tuple(components),
        breakdown_step=n,
    )


def _batches(slow_rank: int, slow_parts: dict[str, float]) -> list[ReportBatch]:
    waiting = {"compute": 0.5, "exposed_comm": 0.5}  # the others wait for the slow rank
    return [
        ReportBatch(
            job="job-a",
            rank=rank,
            world_size=4,
            host="node-0",
            device="cpu",
            peak_flops=1e11,
            peak_source="user",
            sent_unix_ns=1,
            reports=tuple(
                _step(n, slow_parts if rank == slow_rank else waiting) for n in range(1, 6)
            ),
        )
        for rank in range(4)
    ]


@pytest.mark.parametrize(
    ("slow_rank", "slow_parts", "own_ratio"),
    [
        # A slow data loader: the rank's device idles waiting for its own input (bubble_idle),
        # so its busy time (compute + recompute + other) looks like everyone else's.
        (2, {"compute": 0.5, "bubble_idle": 0.4, "exposed_comm": 0.1}, 0.9 / 0.5),
        # A slow GPU: more compute.
        (3, {"compute": 0.8, "other": 0.1, "exposed_comm": 0.1}, 0.9 / 0.5),
    ],
)
def test_report_and_collector_name_the_same_straggler(
    slow_rank: int, slow_parts: dict[str, float], own_ratio: float
) -> None:
    batches = _batches(slow_rank, slow_parts)
    collector = Aggregator(StateConfig(straggler_top=4), clock=FakeClock())
    for batch in batches:
        collector.apply(batch)
    (job,) = collector.snapshot().jobs
    view = straggler_view(merge_batches(batches))

    assert job.straggler_basis == view.basis == "self"
    assert job.stragglers[0].rank == slow_rank
    assert view.slowest is not None and view.slowest.rank == slow_rank
    assert [(s.rank, s.ratio) for s in view.stragglers] == [
        (s.rank, pytest.approx(s.ratio)) for s in job.stragglers
    ]
    assert job.stragglers[0].ratio == pytest.approx(own_ratio)
