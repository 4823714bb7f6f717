"""The report's pure aggregation: merging batches, decomposition, waterfall, MFU, stragglers,
bandwidth (core/run_summary)."""

from __future__ import annotations

import math
import random

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from mfuscope.core.bandwidth import LinkModel, busbw_bytes_per_s, ideal_transfer_s
from mfuscope.core.errors import ReportInputError
from mfuscope.core.run_summary.breakdowns import (
    KERNEL_INEFFICIENCY,
    UNFUSED_KERNELS,
    decomposition_per_rank,
    job_waterfall,
    overall_utilization,
    utilization_over_steps,
)
from mfuscope.core.run_summary.coverage import Coverage, rank_coverage
from mfuscope.core.run_summary.kernel_classes import class_split_per_rank
from mfuscope.core.run_summary.rank_pace import straggler_view
from mfuscope.core.run_summary.run_data import RunData, merge_batches
from mfuscope.core.run_summary.tier_bandwidth import bandwidth_by_tier
from mfuscope.core.schema import (
    AgentHealth,
    ClassShare,
    CollectiveSample,
    ComponentShare,
    GroupInfo,
    ReportBatch,
    StepReport,
    Topology,
)


def _step(
    n: int,
    wall: float,
    parts: dict[str, float] | None = None,
    *,
    flops: float = 0.0,
    recompute: float = 0.0,
    comm: tuple[tuple[str, str, float], ...] = (),
    collectives: tuple[CollectiveSample, ...] = (),
) -> StepReport:
    """`parts` maps components to seconds; the rest of the wall time is bubble_idle."""
    components: list[ComponentShare] = []
    if parts is not None or comm:
        given_parts = dict(parts or {})
        components = [ComponentShare(c, s) for c, s in given_parts.items()]
        components += [ComponentShare("exposed_comm", s, axis=a, tier=t) for a, t, s in comm]
        rest = wall - sum(c.seconds for c in components)
        components.append(ComponentShare("bubble_idle", rest))
    return StepReport(
        step=n,
        start_unix_ns=n * 1_000_000,
        wall_s=wall,
        model_flops=flops,
        recompute_flops=recompute,
        components=tuple(components),
        collectives=collectives,
        breakdown_step=n if components else None,  # measured on the step itself
    )


def _batch(
    rank: int,
    steps: list[StepReport],
    *,
    job: str = "j",
    world: int = 2,
    peak: float | None = 1e12,
    sent: int = 0,
    health: AgentHealth | None = None,
    topology: Topology | None = None,
) -> ReportBatch:
    return ReportBatch(
        job=job,
        rank=rank,
        world_size=world,
        host=f"h{rank}",
        device="dev",
        peak_flops=peak,
        peak_source="spec" if peak else "unknown",
        sent_unix_ns=sent,
        reports=tuple(steps),
        health=health or AgentHealth(),
        topology=topology,
    )


# --- merging ---------------------------------------------------------------------------------


def test_merge_dedupes_on_rank_and_step_first_copy_wins() -> None:
    first = _batch(0, [_step(1, 1.0), _step(2, 2.0)], sent=1)
    resent = _batch(0, [_step(2, 9.0), _step(3, 3.0)], sent=2, health=AgentHealth(3, 1, 0, 2))
    run = merge_batches([first, resent, _batch(1, [_step(1, 1.0)])])
    (r0, r1) = run.ranks
    assert [s.step for s in r0.steps] == [1, 2, 3]
    assert [s.wall_s for s in r0.steps] == [1.0, 2.0, 3.0]
    assert r0.health == AgentHealth(3, 1, 0, 2)  # the latest batch's cumulative counters
    assert r1.rank == 1 and run.step_count == 3 and run.world_size == 2


def test_merge_needs_a_job_choice_when_several_are_present() -> None:
    batches = [_batch(0, [_step(1, 1.0)], job="a"), _batch(0, [_step(1, 1.0)], job="b")]
    with pytest.raises(ReportInputError, match="several jobs"):
        merge_batches(batches)
    assert merge_batches(batches, job="b").job == "b"
    with pytest.raises(ReportInputError, match="not in the input"):
        merge_batches(batches, job="c")
    with pytest.raises(ReportInputError, match="no agent batches"):
        merge_batches([])


@settings(max_examples=50, deadline=None)
@given(seed=st.integers(0, 2**32))
def test_merge_does_not_depend_on_batch_order(seed: int) -> None:
    batches = [
        _batch(r, [_step(s, 0.1 + r + s / 10, {"compute": 0.05})], sent=s)
        for r in range(3)
        for s in range(5)
    ]
    shuffled = batches[:]
    random.Random(seed).shuffle(shuffled)
    assert merge_batches(shuffled) == merge_batches(batches)


# --- decomposition and waterfall ---------------------------------------------------------------


def test_decomposition_is_the_mean_per_step_with_shared_segments() -> None:
    run = merge_batches(
        [
            _batch(
                0,
                [
                    _step(0, 1.0),
                    _step(1, 1.0, {"compute": 0.6}, comm=(("dp", "intra_node", 0.1),)),
                    _step(2, 2.0, {"compute": 1.0}, comm=(("dp", "intra_node", 0.5),)),
                ],
            ),
            _batch(1, [_step(1, 1.0, {"compute": 0.9, "recompute": 0.1})]),
        ]
    )
    r0, r1 = decomposition_per_rank(run)
    assert (r0.steps, r0.mean_step_s) == (2, 1.5)  # step 0 has no components: left out
    seconds0 = {s.label: s.seconds for s in r0.segments}
    assert seconds0 == pytest.approx(
        {"compute": 0.8, "recompute": 0.0, "exposed comm dp/intra_node": 0.3, "bubble idle": 0.4}
    )
    assert [s.label for s in r1.segments] == [s.label for s in r0.segments]
    assert r1.fraction("compute") == pytest.approx(0.9)
    assert r1.fraction("exposed_comm") == 0.0


def test_waterfall_known_values() -> None:
    # 1 s at 1 TFLOP/s peak: compute 0.5 s doing 0.25 TFLOP, exposed comm 0.2 s, idle 0.3 s.
    step = _step(
        0,
        1.0,
        {"compute": 0.5},
        comm=(("dp", "intra_node", 0.2),),
        flops=0.25e12,
        recompute=0.05e12,
    )
    w = job_waterfall(merge_batches([_batch(0, [step], world=1)]))
    assert w is not None
    assert w.mfu == pytest.approx(0.25) and w.hfu == pytest.approx(0.30)
    assert w.kernel_efficiency == pytest.approx(0.5)
    slices = {s.label: s.fraction for s in w.slices}
    assert slices == pytest.approx(
        {"exposed comm dp/intra_node": 0.2, "bubble idle": 0.3, KERNEL_INEFFICIENCY: 0.25}
    )
    assert [s.component for s in w.slices] == ["exposed_comm", "bubble_idle", KERNEL_INEFFICIENCY]


def test_waterfall_shows_unfused_kernels_apart_and_classes_per_rank() -> None:
    # As above, the 0.5 s of compute split 0.2 s gemm, 0.25 s elementwise, 0.05 s attention:
    # the 0.25 kernel slice is 0.25 unfused kernels and 0 kernel inefficiency left.
    classes = (
        ClassShare("gemm", 0.2),
        ClassShare("attention", 0.05),
        ClassShare("elementwise_norm_reduce", 0.25),
        ClassShare("other", 0.0),
    )
    base = _step(0, 1.0, {"compute": 0.5}, comm=(("dp", "intra_node", 0.2),), flops=0.25e12)
    split = msgspec.structs.replace(base, compute_classes=classes)
    cpu = _step(1, 1.0, {"compute": 0.5}, flops=0.25e12)  # no class split: adds nothing
    run = merge_batches([_batch(0, [split, cpu], world=2), _batch(1, [cpu], world=2)])
    w = job_waterfall(run)
    assert w is not None
    slices = {s.label: s.fraction for s in w.slices}
    assert slices[UNFUSED_KERNELS] == pytest.approx(0.25 / 3)
    assert slices[KERNEL_INEFFICIENCY] == pytest.approx(0.75 / 3 - 0.25 / 3)
    assert math.fsum(slices.values()) + w.mfu == pytest.approx(1.0)
    (rank,) = class_split_per_rank(run)  # rank 1 carries no split
    assert (rank.rank, rank.steps, rank.compute_s) == (0, 1, pytest.approx(0.5))
    assert rank.share("elementwise_norm_reduce") == pytest.approx(0.5)
    assert [c for c, _ in rank.seconds] == ["gemm", "attention", "elementwise_norm_reduce", "other"]
    no_split = job_waterfall(merge_batches([_batch(0, [cpu], world=1)]))
    assert no_split is not None and UNFUSED_KERNELS not in {s.label for s in no_split.slices}


def test_waterfall_weights_ranks_by_their_peak() -> None:
    # Rank 0 (peak 3) is fully busy at MFU 1; rank 1 (peak 1) is idle. Job MFU = 3/4, as
    # sum(model_flops) / sum(peak * wall) gives, not the mean of per-rank MFUs (1/2).
    busy = _batch(0, [_step(0, 1.0, {"compute": 1.0}, flops=3.0)], peak=3.0)
    idle = _batch(1, [_step(0, 1.0, {})], peak=1.0)
    w = job_waterfall(merge_batches([busy, idle]))
    assert w is not None
    assert w.mfu == pytest.approx(0.75)
    assert {s.label: s.fraction for s in w.slices} == pytest.approx(
        {"bubble idle": 0.25, KERNEL_INEFFICIENCY: 0.0}
    )


_COMPONENTS = st.fixed_dictionaries(
    {c: st.floats(0.0, 1.0) for c in ("compute", "recompute", "other", "bubble_pipeline")}
)


@settings(max_examples=150, deadline=None)
@given(
    ranks=st.lists(
        st.tuples(
            st.floats(1e9, 1e15),  # peak
            st.lists(
                st.tuples(
                    st.floats(1e-3, 10.0),
                    _COMPONENTS,
                    st.floats(0, 1),
                    st.floats(0, 1),
                    st.floats(0, 0.5),
                ),
                min_size=1,
                max_size=5,
            ),
        ),
        min_size=1,
        max_size=4,
    )
)
def test_waterfall_slices_and_mfu_sum_to_one(
    ranks: list[tuple[float, list[tuple[float, dict[str, float], float, float, float]]]],
) -> None:
    batches = []
    for rank, (peak, steps) in enumerate(ranks):
        reports = []
        for n, (wall, weights, comm, efficiency, recompute_share) in enumerate(steps):
            total = sum(weights.values()) + comm + 1.0  # +1: some idle time always
            parts = {c: wall * v / total for c, v in weights.items()}
            comm_s = wall * comm / total
            flops = peak * parts["compute"] * efficiency
            reports.append(
                _step(
                    n,
                    wall,
                    parts,
                    comm=(("dp", "intra_node", comm_s),),
                    flops=flops,
                    recompute=flops * recompute_share,
                )
            )
        batches.append(_batch(rank, reports, world=len(ranks), peak=peak))
    run = merge_batches(batches)
    w = job_waterfall(run)
    assert w is not None
    assert math.fsum(s.fraction for s in w.slices) + w.mfu == pytest.approx(1.0, abs=1e-9)
    assert 0 <= w.mfu <= w.hfu + 1e-12
    assert all(s.fraction >= -1e-12 for s in w.slices)  # efficiency <= 1 here
    overall = overall_utilization(run)
    assert overall is not None and overall[0] == pytest.approx(w.mfu)
    for rank in decomposition_per_rank(run):
        assert math.fsum(s.seconds for s in rank.segments) == pytest.approx(rank.mean_step_s)


def test_waterfall_and_mfu_are_unknown_without_flops_or_peaks() -> None:
    step = _step(0, 1.0, {"compute": 1.0}, flops=1.0)
    no_peak = merge_batches([_batch(0, [step], peak=None)])
    assert job_waterfall(no_peak) is None
    assert utilization_over_steps(no_peak) == ()
    assert overall_utilization(no_peak) is None
    with_peak = merge_batches([_batch(0, [step])])
    no_flops = RunData(with_peak.job, 1, with_peak.ranks, "traces", flops_known=False)
    assert job_waterfall(no_flops) is None and overall_utilization(no_flops) is None


def test_utilization_per_step_is_a_ratio_of_sums() -> None:
    run = merge_batches(
        [
            _batch(
                0, [_step(0, 1.0, flops=2.0, recompute=1.0), _step(1, 2.0, flops=2.0)], peak=4.0
            ),
            _batch(1, [_step(0, 1.0, flops=1.0)], peak=1.0),
        ]
    )
    s0, s1 = utilization_over_steps(run)
    assert (s0.step, s0.ranks) == (0, 2)
    assert s0.mfu == pytest.approx(3.0 / 5.0) and s0.hfu == pytest.approx(4.0 / 5.0)
    assert (s1.step, s1.ranks, s1.mfu) == (1, 1, pytest.approx(2.0 / 8.0))


# --- stragglers --------------------------------------------------------------------------------


def test_straggler_view_finds_the_slow_rank() -> None:
    # Rank 1 computes 0.9 s per 1 s step; the others compute 0.5 s and wait the rest in
    # exposed communication. Own time: 1.01 - 0.1 = 0.91 s against 0.5 s.
    batches = [
        _batch(
            r,
            [
                _step(
                    n,
                    1.0 + 0.01 * (r == 1),
                    {"compute": 0.9 if r == 1 else 0.5},
                    comm=(("dp", "intra_node", 0.1 if r == 1 else 0.5),),
                )
                for n in range(4)
                if not (r == 2 and n == 3)
            ],
            world=3,
        )
        for r in range(3)
    ]
    view = straggler_view(merge_batches(batches))
    paces = {p.rank: p for p in view.ranks}
    assert view.basis == "self"
    assert paces[1].ratio == pytest.approx(0.91 / 0.5)
    assert paces[0].ratio == pytest.approx(1.0)
    assert paces[1].median_step_s == pytest.approx(1.01)
    assert paces[1].median_own_s == pytest.approx(0.91)
    assert view.slowest is not None and view.slowest.rank == 1
    assert [s.rank for s in view.named] == [1]  # 1.82 is past the threshold
    assert view.steps == (0, 1, 2, 3)
    assert view.relative_step_time[2][3] is None  # rank 2 never reported step 3
    assert view.relative_step_time[1][0] == pytest.approx(1.01)


def test_straggler_own_time_is_unknown_without_components() -> None:
    view = straggler_view(merge_batches([_batch(0, [_step(0, 1.0)]), _batch(1, [_step(0, 3.0)])]))
    assert [p.median_own_s for p in view.ranks] == [None, None]
    assert view.basis == "wall" and view.slowest is not None and view.slowest.rank == 1
    assert [p.ratio for p in view.ranks] == pytest.approx([0.5, 1.5])


def test_a_rank_is_named_a_straggler_only_past_the_threshold() -> None:
    # 1.19 and 1.21 times the median own time: only the second is named; both are the slowest.
    for factor, named in ((1.19, []), (1.21, [1])):
        batches = [
            _batch(r, [_step(n, 1.0, {"compute": 0.5 * (factor if r == 1 else 1.0)}, comm=(
                ("dp", "intra_node", 0.5 * (2 - factor) if r == 1 else 0.5),)) for n in range(3)],
                world=3)
            for r in range(3)
        ]  # fmt: skip
        view = straggler_view(merge_batches(batches))
        assert view.slowest is not None and view.slowest.rank == 1
        assert [s.rank for s in view.named] == named


def test_the_straggler_ratio_is_over_the_last_reports_as_sent() -> None:
    # A late window report (step 1, sent last) is in the window; the earliest report is not.
    early = [_step(n, 1.0, {"compute": 0.5}, comm=(("dp", "intra_node", 0.5),)) for n in (0, 2)]
    slow_late = _step(1, 1.0, {"compute": 0.9}, comm=(("dp", "intra_node", 0.1),))
    rank0 = [_batch(0, early, sent=1), _batch(0, [slow_late], sent=2)]
    rank1 = [_batch(1, [_step(n, 1.0, {"compute": 0.5}, comm=(("dp", "intra_node", 0.5),))
                        for n in range(3)], sent=1)]  # fmt: skip
    run = merge_batches(rank0 + rank1, window_steps=2)
    assert [s.step for s in run.ranks[0].recent] == [2, 1]
    assert [s.step for s in run.ranks[0].steps] == [0, 1, 2]
    paces = {p.rank: p for p in straggler_view(run).ranks}
    assert paces[0].straggler_step_s == pytest.approx((0.5 + 0.9) / 2)


# --- bandwidth ---------------------------------------------------------------------------------


def _allreduce(size: int, count: int, seconds: float, tier: str = "intra_node") -> CollectiveSample:
    return CollectiveSample(
        op="all_reduce",
        axis="dp",
        tier=tier,
        group_size=4,
        bytes=size,
        count=count,
        seconds=seconds,
        overlapped_s=0.0,
    )


def test_bandwidth_merges_calls_and_follows_nccl_tests() -> None:
    topo = Topology((GroupInfo("dp", "intra_node", 4, False, 4.5e11),))
    run = merge_batches(
        [
            _batch(
                0,
                [_step(0, 1.0, collectives=(_allreduce(1 << 20, 2, 4e-3),))],
                world=4,
                topology=topo,
            ),
            _batch(
                1,
                [
                    _step(
                        0,
                        1.0,
                        collectives=(
                            _allreduce(1 << 20, 1, 5e-3),
                            CollectiveSample(
                                op="all_gather",
                                axis="dp",
                                tier="intra_node",
                                group_size=4,
                                bytes=None,
                                count=1,
                                seconds=1e-3,
                                overlapped_s=0.0,
                            ),
                            _allreduce(1 << 10, 1, 0.0),
                        ),
                    )
                ],
                world=4,
            ),
        ]
    )
    (tier,) = bandwidth_by_tier(run)
    (point,) = tier.points  # unknown size and zero duration are left out
    assert (point.calls, point.seconds_per_call) == (3, pytest.approx(3e-3))
    assert point.busbw_bytes_per_s == pytest.approx(
        busbw_bytes_per_s("all_reduce", 4, 1 << 20, 3e-3)
    )
    assert point.bus_bytes == pytest.approx((1 << 20) * 1.5)
    assert tier.specs == (("dp", 4.5e11),)
    assert tier.fit is None  # one size only


def test_bandwidth_fit_recovers_the_tier_model() -> None:
    truth = LinkModel(30e-6, 2e10)
    sizes = [1 << k for k in range(12, 28, 3)]
    reports = [
        _step(
            0,
            1.0,
            collectives=tuple(
                _allreduce(s, 2, 2 * ideal_transfer_s(truth, s * 1.5), "inter_node") for s in sizes
            ),
        )
    ]
    (tier,) = bandwidth_by_tier(merge_batches([_batch(0, reports, world=4)]))
    assert tier.tier == "inter_node" and tier.specs == ()
    assert tier.fit is not None
    assert tier.fit.link.alpha_s == pytest.approx(30e-6, rel=1e-6)
    assert tier.fit.link.beta_bytes_per_s == pytest.approx(2e10, rel=1e-6)


def test_the_spread_between_windows_is_of_the_shares_the_later_steps_carry() -> None:
    def exposed(n: int, share: float) -> StepReport:
        return _step(n, 0.02, {"compute": 0.02 * (1 - share), "exposed_comm": 0.02 * share})

    # two windows of 3 steps: their first steps (the profiler's start) are left out
    steps = [exposed(10, 0.9), exposed(11, 0.1), exposed(12, 0.3)]
    steps += [exposed(70, 0.05), exposed(71, 0.4), exposed(72, 0.4)]
    ranks = rank_coverage(0, steps)
    assert ranks.windows == 2 and ranks.exposed_spread == pytest.approx(0.4 - 0.2)
    assert rank_coverage(0, steps[:3]).exposed_spread is None  # one window: no spread
    whole = Coverage((ranks, rank_coverage(1, steps[:3])))
    assert whole.exposed_spread == pytest.approx(0.2)
    assert "exposed comm differed by up to 20.0 points" in whole.describe()
