"""Report building: breakdown fractions, components that sum to wall_s, collective aggregation."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import replace

import pytest
from hypothesis import given
from hypothesis import strategies as st
from mfuscope.core.schema import (
    CollectiveSample,
    ComponentShare,
    ReportBatch,
    StepReport,
    decode_batch,
    encode_batch,
)
from mfuscope.core.step_report import (
    BlockedSample,
    Breakdown,
    Share,
    blocked_elsewhere_s,
    breakdown_from_steps,
    carried_breakdown,
    carried_components,
    collective_samples,
    components_for,
    make_report,
)

from tests.support.agent_fakes import Decomposition, Exposed, Record


def _step(step: int = 1, **kwargs: float) -> Decomposition:
    values = {"compute_s": 0.6, "recompute_s": 0.1, "other_s": 0.05, "bubble_idle_s": 0.05}
    values.update(kwargs)
    exposed = values.pop("exposed", 0.2)
    wall = math.fsum(values.values()) + exposed - values.get("overlapped_comm_s", 0.0)
    return Decomposition(
        step=step,
        wall_s=wall,
        exposed_comm_s=exposed,
        exposed_comm=(
            Exposed("dp", "inter_node", exposed * 0.75),
            Exposed("tp", "intra_node", exposed * 0.25),
        ),
        **values,
    )


def test_breakdown_fractions_and_scaling() -> None:
    breakdown = breakdown_from_steps([_step(overlapped_comm_s=0.0)], 1)
    assert breakdown is not None and breakdown.step == 1
    shares = {(s.component, s.axis, s.tier): s.fraction for s in breakdown.shares}
    assert shares == pytest.approx(
        {
            ("compute", "", ""): 0.6,
            ("recompute", "", ""): 0.1,
            ("other", "", ""): 0.05,
            ("bubble_idle", "", ""): 0.05,
            ("exposed_comm", "dp", "inter_node"): 0.15,
            ("exposed_comm", "tp", "intra_node"): 0.05,
        }
    )
    components = components_for(breakdown, 2.0)
    assert math.fsum(c.seconds for c in components) == 2.0
    by_key = {(c.component, c.axis): c.seconds for c in components}
    assert by_key[("compute", "")] == pytest.approx(1.2)
    assert by_key[("exposed_comm", "dp")] == pytest.approx(0.3)


@pytest.mark.parametrize(("wall_s", "measured_s"), [(0.1, 0.012), (0.3, 0.25), (0.01, 0.02)])
def test_a_profiled_step_keeps_its_measured_seconds_and_the_rest_is_instrumentation(
    wall_s: float, measured_s: float
) -> None:
    breakdown = breakdown_from_steps([_step(overlapped_comm_s=0.1)], 1)
    assert breakdown is not None
    report = make_report(
        step=1,
        start_unix_ns=0,
        wall_s=wall_s,
        model_flops=0.0,
        recompute_flops=0.0,
        breakdown=breakdown,
        measured_s=measured_s,
    )
    seconds = {(c.component, c.axis): c.seconds for c in report.components}
    assert math.isclose(math.fsum(seconds.values()), wall_s, rel_tol=1e-12)
    assert _through_the_wire(report).components == report.components
    if measured_s < wall_s:  # the window on the trace in seconds as measured; the rest is ours
        assert seconds[("instrumentation", "")] == pytest.approx(wall_s - measured_s)
        assert seconds[("compute", "")] == pytest.approx(0.6 * measured_s)
        assert report.overlapped_comm_s == pytest.approx(0.1 * measured_s)
    else:  # a trace window longer than the period (clock skew): scaled to the period, as before
        assert ("instrumentation", "") not in seconds
        assert seconds[("compute", "")] == pytest.approx(0.6 * wall_s)


def test_the_carried_breakdown_leaves_out_the_window_step_the_profiler_starts_in() -> None:
    # step 7: waits half a second for a peer's profiler start; steps 8, 9: ordinary
    started = _step(7, exposed=0.5, compute_s=0.01)
    steps = [_step(9, exposed=0.1), started, _step(8, exposed=0.3)]
    carried = carried_breakdown(steps, 9)
    assert carried == breakdown_from_steps([steps[0], steps[2]], 9)
    assert carried_breakdown([started], 7) == breakdown_from_steps([started], 7)  # all there is
    assert carried_breakdown([], 7) is None


def test_blocked_time_elsewhere_is_the_upper_quartile_of_the_bounded_window_steps() -> None:
    # per step: blocked - exposed comm, at most the step's idle time and at least minus its run
    # delay; the upper quartile (nearest rank) over the steps but the first (the profiler's start)
    started = BlockedSample(blocked_s=0.020, run_delay_s=0.5, exposed_comm_s=0.001, idle_s=0.02)
    samples = [
        started,  # 0.019: left out
        BlockedSample(blocked_s=0.004, run_delay_s=0.002, exposed_comm_s=0.007, idle_s=0.0045),
        # -0.003 -> -0.002
        BlockedSample(blocked_s=0.0081, run_delay_s=0.0, exposed_comm_s=0.0042, idle_s=0.0045),
        # 0.0039
        BlockedSample(blocked_s=math.nan, run_delay_s=0.0, exposed_comm_s=0.001, idle_s=0.0045),
        # nan -> 0 - 0.001
    ]
    assert blocked_elsewhere_s(samples) == pytest.approx(0.0039)  # of 3: the largest
    assert blocked_elsewhere_s(samples[:2]) == pytest.approx(-0.002)
    assert blocked_elsewhere_s(samples[:3]) == pytest.approx(0.0039)  # of 2: the larger
    # of 5: the 4th smallest, not the largest (a step that blocked elsewhere)
    five = [started, *(replace(samples[2], blocked_s=0.0042 + 0.001 * k) for k in range(5))]
    assert blocked_elsewhere_s(five) == pytest.approx(0.003)
    # bounded by the idle time: blocked time outside communication is idle on the trace
    long = BlockedSample(blocked_s=0.020, run_delay_s=0.0, exposed_comm_s=0.002, idle_s=0.0045)
    assert blocked_elsewhere_s([started, long]) == pytest.approx(0.0045)
    assert blocked_elsewhere_s([started]) == pytest.approx(0.019)  # all there is
    assert blocked_elsewhere_s([]) is None
    # a thread that waited 3 ms for a CPU inside the collective: the trace's 6 ms of comm hold
    # it, its 4 ms blocked do not; a carried step less 2 ms gets that wait too
    preempted = BlockedSample(blocked_s=0.004, run_delay_s=0.003, exposed_comm_s=0.006, idle_s=0.0)
    assert blocked_elsewhere_s([started, preempted]) == pytest.approx(-0.002)


def _cpu_window(elsewhere: float | None) -> Breakdown:
    # compute 50 %, idle 30 %, exposed comm 20 % (dp 3/4, tp 1/4)
    return Breakdown(
        step=12,
        shares=(
            Share("compute", 0.5),
            Share("bubble_idle", 0.3),
            Share("exposed_comm", 0.15, "dp", "inter_node"),
            Share("exposed_comm", 0.05, "tp", "intra_node"),
        ),
        overlapped_fraction=0.0,
        blocked_elsewhere_s=elsewhere,
    )


def _seconds(components: tuple[ComponentShare, ...]) -> dict[tuple[str, str], float]:
    return {(c.component, c.axis): c.seconds for c in components}


def test_a_carried_cpu_step_takes_its_exposed_comm_from_its_own_blocked_time() -> None:
    # a 10 ms step blocked 7 ms, 4 ms of which the window found blocked elsewhere: 3 ms of comm,
    # split 3:1 over dp and tp as in the window; compute and idle share the other 7 ms 5:3
    seconds = _seconds(carried_components(_cpu_window(0.004), 0.010, 0.007))
    assert seconds[("exposed_comm", "dp")] == pytest.approx(0.00225)
    assert seconds[("exposed_comm", "tp")] == pytest.approx(0.00075)
    assert seconds[("compute", "")] == pytest.approx(0.007 * 5 / 8)
    assert seconds[("bubble_idle", "")] == pytest.approx(0.007 * 3 / 8)
    assert math.fsum(seconds.values()) == pytest.approx(0.010, rel=1e-12)
    # with the same window, a step blocked less than the time elsewhere carries no comm ...
    less = _seconds(carried_components(_cpu_window(0.004), 0.010, 0.003))
    assert ("exposed_comm", "dp") not in less
    assert less[("compute", "")] == pytest.approx(0.010 * 5 / 8)
    # ... and one blocked all along (a rank waiting for a stalled peer) is all comm
    waiting = _seconds(carried_components(_cpu_window(0.004), 0.010, 0.5))
    assert waiting == pytest.approx(
        {("exposed_comm", "dp"): 0.0075, ("exposed_comm", "tp"): 0.0025}
    )


def test_without_a_thread_clock_or_window_comm_a_step_carries_the_shares() -> None:
    shares = components_for(_cpu_window(None), 0.010)
    assert carried_components(_cpu_window(None), 0.010, 0.007) == shares  # GPU, or no clock
    assert carried_components(_cpu_window(0.004), 0.010, None) == shares  # step not clocked
    assert carried_components(_cpu_window(0.004), 0.010, math.nan) == shares
    quiet = Breakdown(12, (Share("compute", 0.6), Share("bubble_idle", 0.4)), 0.0, (), 0.001)
    # blocked time is no evidence of communication where the window saw none
    assert carried_components(quiet, 0.010, 0.008) == components_for(quiet, 0.010)


def test_a_carried_cpu_step_s_wait_for_data_beyond_the_window_s_is_idle() -> None:
    # the window waited 1 ms per step in its data loader; this 20 ms step waited 9 ms (a late
    # loader): 8 ms beyond are idle, its 3 ms of comm are its blocked time less the 4 ms
    # elsewhere, and the other 9 ms share compute and idle 5:3 as in the window
    window = replace(_cpu_window(0.004), data_wait_s=0.001)
    seconds = _seconds(carried_components(window, 0.020, 0.007, 0.009))
    assert seconds[("exposed_comm", "dp")] + seconds[("exposed_comm", "tp")] == pytest.approx(0.003)
    assert seconds[("bubble_idle", "")] == pytest.approx(0.008 + 0.009 * 3 / 8)
    assert seconds[("compute", "")] == pytest.approx(0.009 * 5 / 8)
    assert math.fsum(seconds.values()) == pytest.approx(0.020, rel=1e-12)
    # waiting less than the window moves nothing; nor does a wait unknown on either side
    shares = carried_components(window, 0.020, 0.007)
    assert carried_components(window, 0.020, 0.007, 0.0005) == shares
    assert carried_components(_cpu_window(0.004), 0.020, 0.007, 0.009) == shares
    # a window without idle time still puts the stall there
    busy = Breakdown(
        12, (Share("compute", 0.8), Share("exposed_comm", 0.2)), 0.0, (), 0.0, data_wait_s=0.0
    )
    stalled = _seconds(carried_components(busy, 0.010, 0.002, 0.004))
    assert stalled[("bubble_idle", "")] == pytest.approx(0.004)
    assert stalled[("compute", "")] == pytest.approx(0.004)


def test_unattributed_exposed_time_keeps_an_unknown_axis() -> None:
    step = Decomposition(
        step=3,
        wall_s=1.0,
        compute_s=0.5,
        exposed_comm_s=0.5,
        exposed_comm=(Exposed("dp", "weird-tier", 0.2),),
    )
    breakdown = breakdown_from_steps([step], 3)
    assert breakdown is not None
    shares = {(s.component, s.axis, s.tier): s.fraction for s in breakdown.shares}
    assert shares[("exposed_comm", "dp", "unknown")] == pytest.approx(0.2)
    assert shares[("exposed_comm", "unknown", "unknown")] == pytest.approx(0.3)


def test_empty_windows_give_no_breakdown() -> None:
    assert breakdown_from_steps([], 1) is None
    assert breakdown_from_steps([Decomposition(step=1, wall_s=0.0, compute_s=0.0)], 1) is None


def test_collectives_aggregate_per_key_skip_unknown_ops_and_keep_unknown_groups() -> None:
    records = [
        Record("all_reduce", "dp", "inter_node", 16, 1000, 0.5, 0.5),
        Record("all_reduce", "dp", "inter_node", 16, 1000, 0.25, 1.0),
        Record("all_reduce", "dp", "inter_node", 16, 2000, 0.1, 0.0),
        Record("all_gather", "", "intra_node", 8, None, 0.2, float("nan")),
        Record("barrier", "dp", "inter_node", 16, 0, 0.1, 0.0),
        Record("send", "pp", "inter_node", 0, 10, 0.1, 0.0),
        Record("all_reduce", "unknown", "intra_node", None, 40, 0.3, 0.0),
    ]
    # A group size that is unknown (None, or not positive) stays null: the collective's time and
    # bytes still count (never the world size in its place).
    assert collective_samples(records) == (
        CollectiveSample(
            op="all_gather",
            axis="unknown",
            tier="intra_node",
            group_size=8,
            bytes=None,
            count=1,
            seconds=0.2,
            overlapped_s=0.0,
        ),
        CollectiveSample(
            op="all_reduce",
            axis="dp",
            tier="inter_node",
            group_size=16,
            bytes=1000,
            count=2,
            seconds=0.75,
            overlapped_s=0.5,
        ),
        CollectiveSample(
            op="all_reduce",
            axis="dp",
            tier="inter_node",
            group_size=16,
            bytes=2000,
            count=1,
            seconds=0.1,
            overlapped_s=0.0,
        ),
        CollectiveSample(
            op="all_reduce",
            axis="unknown",
            tier="intra_node",
            group_size=None,
            bytes=40,
            count=1,
            seconds=0.3,
            overlapped_s=0.0,
        ),
        CollectiveSample(
            op="send",
            axis="pp",
            tier="inter_node",
            group_size=None,
            bytes=10,
            count=1,
            seconds=0.1,
            overlapped_s=0.0,
        ),
    )


bucket = st.floats(min_value=0.0, max_value=5.0, allow_nan=False)


@given(
    compute=bucket,
    recompute=bucket,
    other=bucket,
    pipeline=bucket,
    idle=bucket,
    exposed=st.lists(
        st.tuples(
            st.sampled_from(["dp", "tp", "pp", ""]),
            st.sampled_from(["intra_node", "inter_node", "x"]),
            bucket,
        ),
        max_size=4,
    ),
    wall=st.floats(min_value=1e-6, max_value=86_000.0),
    blocked=st.none() | st.floats(min_value=0.0, max_value=1e5),
    elsewhere=st.floats(min_value=-1e5, max_value=1e5),
    waits=st.none() | st.tuples(bucket, st.floats(min_value=0.0, max_value=1e5)),
)
def test_components_always_sum_to_the_step_and_pass_the_schema(
    compute: float,
    recompute: float,
    other: float,
    pipeline: float,
    idle: float,
    exposed: list[tuple[str, str, float]],
    wall: float,
    blocked: float | None,
    elsewhere: float,
    waits: tuple[float, float] | None,
) -> None:
    # `waits`: the window's and the carried step's time waiting for data
    parts = tuple(Exposed(a, t, s) for a, t, s in exposed)
    total_exposed = math.fsum(p.seconds for p in parts)
    step = Decomposition(
        step=5,
        wall_s=compute + recompute + other + pipeline + idle + total_exposed,
        compute_s=compute,
        recompute_s=recompute,
        other_s=other,
        bubble_pipeline_s=pipeline,
        bubble_idle_s=idle,
        exposed_comm_s=total_exposed,
        exposed_comm=parts,
    )
    breakdown = breakdown_from_steps([step], 5)
    if breakdown is not None and blocked is not None:  # a CPU window, a carried step
        breakdown = dataclasses.replace(
            breakdown,
            blocked_elsewhere_s=elsewhere,
            data_wait_s=None if waits is None else waits[0],
        )
    report = make_report(
        step=9,
        start_unix_ns=1,
        wall_s=wall,
        model_flops=1e12,
        recompute_flops=1e11,
        breakdown=breakdown,
        blocked_s=blocked,
        data_wait_s=None if waits is None else waits[1],
    )
    if breakdown is None:
        assert report.components == ()
        return
    assert math.isclose(math.fsum(c.seconds for c in report.components), wall, rel_tol=1e-9)
    assert all(c.seconds >= 0 for c in report.components)
    assert _through_the_wire(report).components == report.components


@given(st.permutations(list(range(6))))
def test_collective_aggregation_is_independent_of_order(order: list[int]) -> None:
    records = [
        Record("all_reduce", "dp", "inter_node", 4, 100 * (i % 2), 0.1 * (i + 1), 0.5)
        for i in range(6)
    ]
    shuffled = [records[i] for i in order]
    left, right = collective_samples(records), collective_samples(shuffled)
    assert [(s.op, s.bytes, s.count) for s in left] == [(s.op, s.bytes, s.count) for s in right]
    for a, b in zip(left, right, strict=True):
        assert a.seconds == pytest.approx(b.seconds) and a.overlapped_s == pytest.approx(
            b.overlapped_s
        )


def test_compute_classes_from_an_engine_result_reach_the_report() -> None:
    from mfuscope.core.trace import analyze_trace

    from tests.support.trace_builder import TraceBuilder

    b = TraceBuilder(world_size=1)
    b.profiler_step(1, 0.0, 50.0)
    b.kernel(100.0, 30.0, launch_at=1.0)  # gemm
    b.kernel(130.0, 10.0, launch_at=2.0, name="void at::native::vectorized_elementwise_kernel")
    b.kernel(150.0, 10.0, launch_at=3.0)  # after a 10 µs gap
    steps = analyze_trace(b.build()).steps
    breakdown = breakdown_from_steps(steps, 1)
    assert breakdown is not None
    report = make_report(
        step=7, start_unix_ns=0, wall_s=2.0, model_flops=1.0, recompute_flops=0.0,
        breakdown=breakdown,
    )  # fmt: skip
    by_class = {c.kernel_class: c.seconds for c in report.compute_classes}
    # 60 µs window: 40 µs gemm, 10 µs elementwise, 10 µs idle; scaled to a 2 s step
    assert by_class["gemm"] == pytest.approx(2.0 * 40 / 60)
    assert by_class["elementwise_norm_reduce"] == pytest.approx(2.0 * 10 / 60)
    compute = next(c.seconds for c in report.components if c.component == "compute")
    assert math.fsum(by_class.values()) == pytest.approx(compute)
    # A fake decomposition without a class split gives none (never a partial split).
    plain = breakdown_from_steps([_step()], 1)
    assert plain is not None and plain.class_fractions == ()


def _through_the_wire(report: StepReport) -> StepReport:
    """`report` encoded in a batch and decoded again, as the collector receives it."""
    batch = ReportBatch(
        job="j",
        rank=0,
        world_size=1,
        host="h",
        device="cpu",
        peak_flops=1e12,
        peak_source="measured",
        sent_unix_ns=1,
        reports=(report,),
    )
    return decode_batch(encode_batch(batch)).reports[0]
