"""Run against run (pure): rows aligned by label, deltas, the gate's figure, the warnings."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given
from hypothesis import strategies as st
from mfuscope.core.run_summary.comparison import RunProfile, comparable, compare

BASE = RunProfile(
    kind="traces",
    source="base",
    job="j",
    world_size=8,
    ranks=8,
    steps=10,
    rank_steps=80,
    windows=1,
    measured_rank_steps=80,
    devices=("NVIDIA H100 80GB HBM3",),
    peak_flops=(9.89e14,),
    mean_step_s=1.0,
    mfu=0.4,
    hfu=0.45,
    waterfall=(("exposed comm dp/inter_node", 0.1), ("kernel inefficiency", 0.4)),
    shares=(("compute", 0.8), ("exposed comm dp/inter_node", 0.1)),
    kernel_families=(("GEMM / matmul", 0.5), ("flash attention", 0.2)),
)


@given(st.floats(0.01, 100.0), st.floats(0.001, 1.0))
def test_a_run_against_itself_changes_nothing(step_s: float, mfu: float) -> None:
    run = replace(BASE, mean_step_s=step_s, mfu=mfu)
    result = compare(run, run)
    rows = result.headline + result.slices + result.kernel_classes
    assert all(r.delta == 0 for r in rows if r.delta is not None)
    assert result.regression is not None and result.regression.worse_by == 0
    assert result.kernel_families == () and result.warnings == ()


def test_the_gate_reads_mfu_else_step_time() -> None:
    worse = replace(BASE, mean_step_s=1.25, mfu=0.32)
    gate = compare(BASE, worse).regression
    assert gate is not None and gate.metric == "mfu"
    assert gate.worse_by == pytest.approx(0.2) and gate.exceeds(0.1) and not gate.exceeds(0.25)
    unknown = replace(worse, mfu=None, hfu=None, waterfall=())
    result = compare(BASE, unknown)
    assert result.regression is not None and result.regression.metric == "mean_step_s"
    assert result.regression.worse_by == pytest.approx(0.25)
    assert any("only the baseline has MFU" in w for w in result.warnings)
    # Without a waterfall on both sides, both show bucket shares.
    assert not result.slices_are_waterfall and result.slices[0].label == "compute"


def test_only_grown_families_are_listed_largest_growth_first() -> None:
    new = replace(
        BASE,
        kernel_families=(("GEMM / matmul", 0.4), ("flash attention", 0.3), ("NCCL", 0.05)),
    )
    grown = compare(BASE, new).kernel_families
    assert [(r.label, r.delta) for r in grown] == [
        ("flash attention", pytest.approx(0.1)),
        ("NCCL", pytest.approx(0.05)),
    ]


def test_sizes_that_differ_are_warned_and_nothing_to_compare_is_said() -> None:
    other = replace(BASE, world_size=16, ranks=16, peak_flops=(3.12e14,), run_key="fp-2")
    warnings = compare(replace(BASE, run_key="fp-1"), other).warnings
    assert [w.split(":")[0] for w in warnings] == [
        "run keys differ",
        "world sizes differ",
        "ranks measured differ",
        "peaks differ",
    ]
    assert comparable(BASE, other) is None
    empty = replace(BASE, source="empty.json", mean_step_s=None)
    assert comparable(BASE, empty) == (
        "the candidate (empty.json) has no step with a wall time to compare"
    )
