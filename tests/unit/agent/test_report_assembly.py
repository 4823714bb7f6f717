"""The agent's report assembly: held window steps, their own breakdown, the carried breakdown."""

from __future__ import annotations

import pytest
from mfuscope.agent._health import HealthCounters
from mfuscope.agent._report_assembly import BatchHeader, ReportAssembler
from mfuscope.agent._step_flops import StepFlopsValue
from mfuscope.agent._window_coordinator import WindowResult
from mfuscope.agent.step_timer import TimedStep
from mfuscope.core.schema import ComponentShare, decode_batch

from tests.support.agent_fakes import Decomposition, Exposed, Record

_HEADER = BatchHeader(
    job="unit",
    rank=1,
    world_size=2,
    local_rank=1,
    host="h0",
    device="cpu",
    peak_flops=1e11,
    peak_source="user",
    topology=None,
    incarnation="launch-7f3a",
)


def _timed(step: int, wall_s: float = 2.0) -> TimedStep:
    return TimedStep(step=step, start_unix_ns=step * 10**9, wall_s=wall_s)


def _seconds(components: tuple[ComponentShare, ...]) -> dict[str, float]:
    return {c.component: c.seconds for c in components}


def test_window_steps_wait_for_their_result_then_carry_their_own_breakdown() -> None:
    assembler = ReportAssembler(_HEADER, HealthCounters())
    assembler.flops_counted(0, StepFlopsValue(5e9, 1e9, "given"))
    before = assembler.step_finished(_timed(0), hold=False)
    assert [r.step for r in before] == [0] and before[0].components == ()
    assert before[0].model_flops == 5e9 and before[0].recompute_flops == 1e9
    assert assembler.step_finished(_timed(2), hold=True) == []
    assert assembler.step_finished(_timed(3), hold=True) == []
    collective = Record("all_reduce", "dp", "intra_node", 2, 4096, 0.5, 0.6)
    result = WindowResult(
        (2, 3),
        (
            Decomposition(
                2, wall_s=1.0, compute_s=0.6, bubble_idle_s=0.4, collectives=(collective,)
            ),
            Decomposition(3, wall_s=1.0, compute_s=1.0),
        ),
    )
    released = assembler.window_finished(result)
    assert [r.step for r in released] == [2, 3]
    # its own seconds as measured on the trace (1 s); the other second of its 2 s period is the
    # profiler's own cost
    own = _seconds(released[0].components)
    assert own == pytest.approx({"compute": 0.6, "bubble_idle": 0.4, "instrumentation": 1.0})
    assert released[0].overlapped_comm_s == 0.0
    assert released[0].breakdown_step == 2 and len(released[0].collectives) == 1
    assert released[1].collectives == ()
    later = assembler.step_finished(_timed(4), hold=False)[0]
    # later steps carry the window's steps but its first, the profiler's start (step 3: all
    # compute), named after its last step
    assert later.breakdown_step == 3 and later.collectives == ()
    assert _seconds(later.components) == pytest.approx({"compute": 2.0})


def test_a_failed_window_releases_its_steps_with_the_previous_breakdown() -> None:
    assembler = ReportAssembler(_HEADER, HealthCounters())
    assembler.window_finished(WindowResult((0,), (Decomposition(0, wall_s=1.0, compute_s=1.0),)))
    assert assembler.step_finished(_timed(5), hold=True) == []
    late = assembler.step_finished(_timed(6), hold=True)
    assert late == []
    released = assembler.window_finished(WindowResult((5, 6), ()))
    assert [r.breakdown_step for r in released] == [0, 0]
    assert assembler.window_finished(None) == [] and assembler.flush() == []


def test_close_flushes_held_steps_in_order_and_batches_carry_the_header() -> None:
    assembler = ReportAssembler(_HEADER, HealthCounters())
    for step in (8, 7):
        assembler.step_finished(_timed(step), hold=True)
    flushed = assembler.flush()
    assert [r.step for r in flushed] == [7, 8]
    batch = decode_batch(assembler.encode(flushed))
    assert (batch.job, batch.rank, batch.world_size, batch.host) == ("unit", 1, 2, "h0")
    assert [r.step for r in batch.reports] == [7, 8] and batch.peak_source == "user"
    assert batch.incarnation == "launch-7f3a"


def test_batches_carry_the_run_key_once_flops_are_known() -> None:
    from dataclasses import replace

    from mfuscope.core.run_key import fingerprint
    from mfuscope.core.schema import GroupInfo, Topology

    header = replace(
        _HEADER, dtype="fp32", topology=Topology((GroupInfo("dp", "intra_node", 2, False),))
    )
    assembler = ReportAssembler(header, HealthCounters())
    unknown = assembler.step_finished(_timed(0), hold=False)  # no FLOPs counted yet
    assert decode_batch(assembler.encode(unknown)).run_key == ""
    assembler.flops_counted(1, StepFlopsValue(5e9, 0.0, "counted"))
    counted = assembler.step_finished(_timed(1), hold=False)
    key = fingerprint(5e9, 2, [("dp", 2)], "cpu", "fp32")
    assert decode_batch(assembler.encode(counted)).run_key == key
    assert decode_batch(assembler.encode(unknown)).run_key == key  # kept from then on
    users = ReportAssembler(replace(header, run_key="llama nightly"), HealthCounters())
    assert decode_batch(users.encode(unknown)).run_key == "llama nightly"


def _cpu_window(steps: tuple[int, ...], comm_s: tuple[float, ...]) -> WindowResult:
    """A window of 10 ms CPU steps: 4 ms compute, 4 ms idle (a sleep), `comm_s` exposed."""
    return WindowResult(
        steps,
        tuple(
            Decomposition(
                s,
                wall_s=0.008 + c,
                compute_s=0.004,
                bubble_idle_s=0.004,
                exposed_comm_s=c,
                exposed_comm=(Exposed("dp", "intra_node", c),),
            )
            for s, c in zip(steps, comm_s, strict=True)
        ),
    )


def _blocked(step: int, wall_s: float, blocked_s: float | None) -> TimedStep:
    return TimedStep(step, step * 10**7, wall_s, blocked_s, None if blocked_s is None else 0.0)


def test_carried_cpu_steps_take_their_comm_from_their_blocked_time() -> None:
    assembler = ReportAssembler(_HEADER, HealthCounters())
    # window steps blocked 4 ms beyond their exposed comm (the sleep), but the first, the
    # profiler's start, 3 ms less (its wait for a CPU counted inside the collective on the
    # trace): left out
    for step, comm in ((1, 0.002), (2, 0.003), (3, 0.001)):
        blocked = 0.004 + comm - (0.003 if step == 1 else 0.0)
        assert assembler.step_finished(_blocked(step, 0.008 + comm, blocked), hold=True) == []
    assembler.window_finished(_cpu_window((1, 2, 3), (0.002, 0.003, 0.001)))
    # a later step of 15 ms, blocked 10 ms: 6 ms of comm; compute and idle share 9 ms 1:1
    later = assembler.step_finished(_blocked(4, 0.015, 0.010), hold=False)[0]
    assert later.breakdown_step == 3
    assert _seconds(later.components) == pytest.approx(
        {"exposed_comm": 0.006, "compute": 0.0045, "bubble_idle": 0.0045}
    )
    # a step the thread clock did not read carries the window's shares
    unclocked = assembler.step_finished(_blocked(5, 0.015, None), hold=False)[0]
    assert _seconds(unclocked.components)["exposed_comm"] == pytest.approx(0.015 * 0.2 / 1.0)


def test_each_window_measures_the_blocked_time_elsewhere_anew() -> None:
    # a job whose sleep grows from 1 ms to 4 ms between windows: the steps after the second
    # window carry the new sleep as idle, not as communication
    assembler = ReportAssembler(_HEADER, HealthCounters())
    for (a, b), sleep in (((1, 2), 0.001), ((11, 12), 0.004)):
        for step in (a, b):
            assembler.step_finished(_blocked(step, 0.01, sleep + 0.002), hold=True)
        assembler.window_finished(_cpu_window((a, b), (0.002, 0.002)))
        assert assembler.breakdown is not None
        assert assembler.breakdown.blocked_elsewhere_s == pytest.approx(sleep)
    later = assembler.step_finished(_blocked(13, 0.010, 0.006), hold=False)[0]
    assert _seconds(later.components)["exposed_comm"] == pytest.approx(0.002)


def test_a_carried_cpu_step_s_late_data_is_idle_not_communication() -> None:
    # window steps waited 1 ms each in a data loader (left out of their blocked time already);
    # a later step waited 30 ms there: 29 ms are idle, and its comm is its own blocked time less
    # the window's elsewhere (0 here)
    assembler = ReportAssembler(_HEADER, HealthCounters())
    for step, comm in ((1, 0.002), (2, 0.003), (3, 0.001)):
        assembler.data_waited(step, 0.001)
        assembler.step_finished(_blocked(step, 0.008 + comm, comm), hold=True)
    assembler.window_finished(_cpu_window((1, 2, 3), (0.002, 0.003, 0.001)))
    assert assembler.breakdown is not None and assembler.breakdown.data_wait_s == 0.001
    assembler.data_waited(4, 0.030)
    later = assembler.step_finished(_blocked(4, 0.045, 0.005), hold=False)[0]
    seconds = _seconds(later.components)
    assert seconds["exposed_comm"] == pytest.approx(0.005)
    # the other 11 ms share compute and idle 1:1 as in the window
    assert seconds["bubble_idle"] == pytest.approx(0.029 + 0.0055)
    assert seconds["compute"] == pytest.approx(0.0055)
