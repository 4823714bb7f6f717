"""The agent's report assembly: held window steps, their own breakdown, the carried breakdown."""

from __future__ import annotations

import pytest
from mfuscope.agent._health import HealthCounters
from mfuscope.agent._report_assembly import BatchHeader, ReportAssembler
from mfuscope.agent._window_coordinator import WindowResult
from mfuscope.agent.step_flops import StepFlopsValue
from mfuscope.agent.step_timer import TimedStep
from mfuscope.core.schema import ComponentShare, batch_from_json

from tests.support.agent_fakes import Decomposition, Record

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
    batch = batch_from_json(assembler.encode(flushed))
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
    assert batch_from_json(assembler.encode(unknown)).run_key == ""
    assembler.flops_counted(1, StepFlopsValue(5e9, 0.0, "counted"))
    counted = assembler.step_finished(_timed(1), hold=False)
    key = fingerprint(5e9, 2, [("dp", 2)], "cpu", "fp32")
    assert batch_from_json(assembler.encode(counted)).run_key == key
    assert batch_from_json(assembler.encode(unknown)).run_key == key  # kept from then on
    users = ReportAssembler(replace(header, run_key="llama nightly"), HealthCounters())
    assert batch_from_json(users.encode(unknown)).run_key == "llama nightly"
