"""Carried GPU steps from their own collective durations (core.carried_durations, make_report)."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import pytest
from hypothesis import given
from hypothesis import strategies as st
from mfuscope.core.carried_durations import WindowSeconds, carried_seconds, window_seconds
from mfuscope.core.schema import ReportBatch, StepReport, decode_batch, encode_batch
from mfuscope.core.step_report import breakdown_from_steps, make_report

from tests.support.agent_fakes import Decomposition, Exposed, Record

DP = ("all_reduce", "dp", "intra_node")


@dataclass(frozen=True)
class Span:
    op: str
    axis: str
    tier: str
    busy_s: float


@dataclass(frozen=True)
class SpannedStep(Decomposition):
    """A decomposed step with the engine's spans of its collectives."""

    comm_spans: tuple[Span, ...] = ()


def _ddp_step(step: int = 1, *, spans: bool = True) -> SpannedStep:
    """A DDP-like step of 100 ms: 70 ms of compute, five 5 ms all_reduces of which four hide
    under the backward and the last is exposed, 38.4 ms of compute inside their span."""
    hidden = Record("all_reduce", "dp", "intra_node", 2, 1 << 24, 0.005, 1.0)
    exposed = Record("all_reduce", "dp", "intra_node", 2, 1 << 24, 0.005, 0.0)
    return SpannedStep(
        step=step,
        wall_s=0.1,
        compute_s=0.07,
        exposed_comm_s=0.005,
        other_s=0.002,
        bubble_idle_s=0.023,
        overlapped_comm_s=0.02,
        exposed_comm=(Exposed("dp", "intra_node", 0.005),),
        collectives=(hidden, hidden, hidden, hidden, exposed),
        comm_spans=(Span(*DP, 0.0384),) if spans else (),
    )


def _window(**kwargs: object) -> WindowSeconds:
    window = window_seconds([_ddp_step(1), _ddp_step(2)], model_flops=1e12)
    assert window is not None
    return replace(window, **kwargs)


def _parts(wall_s: float, seconds: float, **kwargs: object) -> dict[str, float]:
    window = kwargs.pop("window", None) or _window()
    assert isinstance(window, WindowSeconds)
    parts, _ = carried_seconds(window, wall_s, {DP: seconds}, **kwargs)  # type: ignore[arg-type]
    out: dict[str, float] = {}
    for name, _axis, _tier, value in parts:
        out[name] = out.get(name, 0.0) + value
    assert math.isclose(math.fsum(out.values()), wall_s, rel_tol=1e-12)
    return out


def test_the_window_as_seconds_per_step() -> None:
    window = _window()
    assert window.compute_s == pytest.approx(0.07) and window.other_s == pytest.approx(0.002)
    assert window.exposed == (("dp", "intra_node", pytest.approx(0.005)),)
    (dp,) = window.classes
    assert dp.key == DP and dp.seconds == pytest.approx(0.025)
    assert dp.hidden_s == pytest.approx(0.02) and dp.span_busy_s == pytest.approx(0.0384)
    assert window.model_flops == 1e12 and window.recompute_flops is None
    assert window_seconds([]) is None


def test_a_step_like_the_window_carries_the_windows_seconds() -> None:
    parts = _parts(0.1, 0.025, model_flops=1e12)
    assert parts == pytest.approx(
        {"compute": 0.07, "other": 0.002, "exposed_comm": 0.005, "bubble_idle": 0.023}
    )


def test_a_slower_link_whose_collectives_still_fit_exposes_the_windows_fraction() -> None:
    # 50% slower: 37.5 ms of collectives, still under the 38.4 ms of compute they overlap; only
    # the last bucket's share (a fifth) shows, 50% longer.
    assert _parts(0.1025, 0.0375)["exposed_comm"] == pytest.approx(0.0075)


def test_collectives_beyond_the_compute_of_their_span_are_exposed() -> None:
    # A peer 20 ms late: the first all_reduce spans the wait, 63.4 ms in all against 38.4 ms of
    # compute to hide under.
    assert _parts(0.125, 0.0634)["exposed_comm"] == pytest.approx(0.025)
    # Never more than the collectives took.
    assert _parts(0.2, 0.09, window=_window(compute_s=0.01))["exposed_comm"] <= 0.09


def test_a_longer_step_with_the_same_collectives_is_idle() -> None:
    parts = _parts(0.12, 0.025)  # a data stall of 20 ms
    assert parts["exposed_comm"] == pytest.approx(0.005)
    assert parts["bubble_idle"] == pytest.approx(0.043)


def test_compute_follows_the_steps_flops_and_the_parts_fit_the_step() -> None:
    assert _parts(0.2, 0.025, model_flops=2e12)["compute"] == pytest.approx(0.14)
    assert _parts(0.2, 0.025, model_flops=0.0)["compute"] == pytest.approx(0.07)  # unknown
    # 3x the FLOPs in a step of 0.1 s: the parts exceed it and shrink to it, nothing idle.
    shrunk = _parts(0.1, 0.025, model_flops=3e12)
    assert "bubble_idle" not in shrunk
    assert shrunk["compute"] / shrunk["exposed_comm"] == pytest.approx(0.21 / 0.005)


def test_without_the_engines_spans_the_windows_fraction_alone() -> None:
    window = window_seconds([_ddp_step(spans=False)])
    assert window is not None and window.classes[0].span_busy_s is None
    assert _parts(0.125, 0.0634, window=window)["exposed_comm"] == pytest.approx(0.0634 / 5)


def test_exposure_no_class_explains_is_carried_as_it_was() -> None:
    # A barrier's exposed 2 ms (no collective record) beside the all_reduces'; a class the
    # window never ran is as exposed as its group; a pipeline send keeps the window's seconds.
    step = replace(
        _ddp_step(), exposed_comm=(Exposed("dp", "intra_node", 0.007),), exposed_comm_s=0.007
    )
    window = window_seconds([step])
    assert window is not None
    durations = {DP: 0.025, ("broadcast", "dp", "intra_node"): 0.001, ("send", "pp", "x"): 0.5}
    parts, hidden_s = carried_seconds(window, 0.1, durations)
    comm = {(a, t): v for name, a, t, v in parts if name == "exposed_comm"}
    assert comm == {("dp", "intra_node"): pytest.approx(0.005 + 0.002 + 0.001 * 0.007 / 0.025)}
    assert hidden_s == pytest.approx(0.02 + 0.001 * (1 - 0.007 / 0.025))


def test_collectives_running_at_once_count_once() -> None:
    # Two classes on two streams, each exposed 10 ms at the same instants: the engine splits the
    # instants, 10 ms in all; the step's durations are scaled the same way.
    records = (
        Record("all_gather", "fsdp", "inter_node", 8, 1 << 20, 0.01, 0.0),
        Record("reduce_scatter", "fsdp", "inter_node", 8, 1 << 20, 0.01, 0.0),
    )
    step = SpannedStep(
        step=3,
        wall_s=0.05,
        compute_s=0.04,
        exposed_comm_s=0.01,
        exposed_comm=(Exposed("fsdp", "inter_node", 0.01),),
        collectives=records,
    )
    window = window_seconds([step])
    assert window is not None
    durations = {("all_gather", "fsdp", "inter_node"): 0.02}
    parts, _ = carried_seconds(window, 0.06, durations)
    assert [(n, v) for n, _, _, v in parts if n == "exposed_comm"] == [
        ("exposed_comm", pytest.approx(0.01))
    ]


def _report(durations: dict[tuple[str, str, str], float] | None, **kwargs: object) -> StepReport:
    window = breakdown_from_steps([_ddp_step(1)], 1)
    assert window is not None
    window = replace(window, seconds=_window(), class_fractions=(("gemm", 0.5), ("other", 0.2)))
    values: dict[str, object] = {
        "step": 9,
        "start_unix_ns": 10**18,
        "wall_s": 0.125,
        "model_flops": 1e12,
        "recompute_flops": 0.0,
        "breakdown": window,
        "durations": durations,
    }
    values.update(kwargs)
    return make_report(**values)  # type: ignore[arg-type]


def test_a_report_from_durations_and_without() -> None:
    report = _report({DP: 0.0634})
    seconds = {c.component: c.seconds for c in report.components}
    assert seconds["exposed_comm"] == pytest.approx(0.025)
    assert seconds["compute"] == pytest.approx(0.07) and report.breakdown_step == 1
    assert report.overlapped_comm_s == pytest.approx(0.0634 - 0.025)
    # The compute split as in the window, scaled to the step's compute.
    classes = {c.kernel_class: c.seconds for c in report.compute_classes}
    assert classes == pytest.approx({"gemm": 0.05, "other": 0.02})
    batch = ReportBatch(
        job="j",
        rank=0,
        world_size=2,
        host="h",
        device="d",
        peak_source="unknown",
        sent_unix_ns=10**18,
        reports=(report,),
    )
    assert decode_batch(encode_batch(batch).decode()).reports == (report,)  # the schema takes it
    # Without durations, or on the window's own step: the shares, as before.
    shares = _report(None)
    assert {c.component: c.seconds for c in shares.components}["exposed_comm"] == pytest.approx(
        0.125 * 0.05
    )
    assert _report({DP: 0.0634}, measured_s=0.1).components[-1].component == "instrumentation"


@given(
    compute=st.floats(0.0, 0.2),
    exposed=st.floats(0.0, 0.05),
    took=st.floats(0.0, 0.3),
    hidden=st.floats(0.0, 1.0),
    busy=st.floats(0.0, 0.2),
    wall=st.floats(1e-4, 0.5),
    flops=st.floats(0.0, 1e13),
)
def test_the_parts_always_fill_the_step(
    compute: float,
    exposed: float,
    took: float,
    hidden: float,
    busy: float,
    wall: float,
    flops: float,
) -> None:
    record = Record("all_reduce", "dp", "intra_node", 2, 1024, 0.02, hidden)
    step = SpannedStep(
        step=1,
        wall_s=0.1,
        compute_s=compute,
        exposed_comm_s=exposed,
        exposed_comm=(Exposed("dp", "intra_node", exposed),),
        collectives=(record,),
        comm_spans=(Span(*DP, busy),),
    )
    window = window_seconds([step], model_flops=1e12)
    assert window is not None
    parts, hidden_s = carried_seconds(window, wall, {DP: took}, model_flops=flops)
    assert all(value >= 0 for *_, value in parts)
    assert math.isclose(math.fsum(v for *_, v in parts), wall, rel_tol=1e-9)
    assert 0 <= hidden_s <= wall
