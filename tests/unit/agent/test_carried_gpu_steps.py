"""Report assembly on GPU timelines: carried steps wait for their own collective durations."""

from __future__ import annotations

import pytest
from mfuscope.agent._health import HealthCounters
from mfuscope.agent._report_assembly import BatchHeader, ReportAssembler
from mfuscope.agent._step_flops import StepFlopsValue
from mfuscope.agent._window_coordinator import WindowResult
from mfuscope.agent.step_timer import TimedStep
from mfuscope.core.flight_accounting import StepDurationsUpdate
from mfuscope.core.schema import ComponentShare

from tests.support.agent_fakes import Decomposition, Exposed, Record

_HEADER = BatchHeader(
    job="unit",
    rank=0,
    world_size=2,
    local_rank=0,
    host="h0",
    device="NVIDIA H100 80GB HBM3",
    peak_flops=989e12,
    peak_source="spec",
    topology=None,
    incarnation="launch-1",
)
DP = ("all_reduce", "dp", "intra_node")


def _timed(step: int, wall_s: float = 0.1) -> TimedStep:
    return TimedStep(step=step, start_unix_ns=step * 10**8, wall_s=wall_s)


def _seconds(components: tuple[ComponentShare, ...]) -> dict[str, float]:
    return {c.component: c.seconds for c in components}


def _window(steps: tuple[int, ...]) -> WindowResult:
    """100 ms steps: 70 ms compute, 25 ms of all_reduce of which 5 ms exposed (a fifth), the
    rest idle."""
    return WindowResult(
        steps,
        tuple(
            Decomposition(
                s,
                wall_s=0.1,
                compute_s=0.07,
                bubble_idle_s=0.025,
                exposed_comm_s=0.005,
                exposed_comm=(Exposed("dp", "intra_node", 0.005),),
                collectives=(Record(*DP, 2, 1 << 24, 0.025, 0.8),),
            )
            for s in steps
        ),
    )


def _with_window(timed: bool) -> ReportAssembler:
    assembler = ReportAssembler(_HEADER, HealthCounters(), timed=timed)
    for step in (1, 2):
        assembler.flops_counted(step, StepFlopsValue(1e12, 0.0, "given"))
        assembler.step_finished(_timed(step), hold=True)
    assert [r.step for r in assembler.window_finished(_window((1, 2)))] == [1, 2]
    return assembler


def _update(through: int, **steps: dict[tuple[str, str, str], float] | None) -> StepDurationsUpdate:
    return StepDurationsUpdate(True, through, {int(k[1:]): v for k, v in steps.items()})


def test_a_carried_step_waits_for_its_durations_then_carries_them() -> None:
    assembler = _with_window(timed=True)
    assembler.flops_counted(3, StepFlopsValue(1e12, 0.0, "given"))
    assert assembler.step_finished(_timed(3, 0.12), hold=False) == []  # a data stall of 20 ms
    assert assembler.step_finished(_timed(4, 0.1), hold=False) == []
    (report,) = assembler.durations_known(_update(3, s3={DP: 0.025}))
    assert report.step == 3 and report.breakdown_step == 2
    # Its own collectives, its own length: the stall is idle, not a share of every bucket.
    assert _seconds(report.components) == pytest.approx(
        {"compute": 0.07, "exposed_comm": 0.005, "bubble_idle": 0.045}
    )
    # Durations that come before a step's period: it is reported at once.
    (four,) = assembler.durations_known(_update(5, s4={DP: 0.05}, s5=None))
    assert _seconds(four.components)["exposed_comm"] == pytest.approx(0.01)  # a fifth of it
    (five,) = assembler.step_finished(_timed(5, 0.1), hold=False)
    # A step whose durations are not all known carries the window's shares.
    assert _seconds(five.components)["exposed_comm"] == pytest.approx(0.005)
    assert assembler.flush() == []


def test_without_durations_steps_carry_the_shares_at_once() -> None:
    untimed = _with_window(timed=False)
    (report,) = untimed.step_finished(_timed(3, 0.12), hold=False)
    # The window's shares scaled to the step, as before durations were read.
    assert _seconds(report.components) == pytest.approx(
        {"compute": 0.084, "exposed_comm": 0.006, "bubble_idle": 0.03}
    )
    assert untimed.durations_known(StepDurationsUpdate()) == []
    # The reader saying durations stopped: nothing waits any more.
    timed = _with_window(timed=True)
    assert timed.step_finished(_timed(3, 0.12), hold=False) == []
    (released,) = timed.durations_known(StepDurationsUpdate(timed=False))
    assert released.components == report.components


def test_a_step_whose_durations_never_come_carries_the_shares() -> None:
    assembler = _with_window(timed=True)
    assert assembler.step_finished(_timed(3), hold=False) == []
    # 30 s of later steps without a read (a stopped recorder): step 3 goes with the shares.
    late = assembler.step_finished(TimedStep(400, 3 * 10**8 + 31 * 10**9, 0.1), hold=False)
    assert [r.step for r in late] == [3]
    assert _seconds(late[0].components)["exposed_comm"] == pytest.approx(0.005)


def test_a_waiting_step_keeps_the_breakdown_of_its_time() -> None:
    assembler = _with_window(timed=True)
    assert assembler.step_finished(_timed(3), hold=False) == []
    for step in (11, 12):
        assembler.step_finished(_timed(step), hold=True)
    newer = WindowResult((11, 12), _window((11, 12)).decompositions)
    assembler.window_finished(newer)
    (report,) = assembler.durations_known(_update(3, s3={DP: 0.025}))
    assert report.breakdown_step == 2
    assert [r.step for r in assembler.flush()] == []
