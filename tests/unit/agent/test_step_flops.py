"""FlopsTracker: given FLOPs, count once, recount on new input shapes, bounded recounts."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import pytest
from mfuscope.agent._health import RateLimitedLog
from mfuscope.agent._step_flops import FlopsTracker, StepFlopsValue, input_signature


class FakeSession:
    """Counts as many FLOPs as the fake model's current batch size (x 1e9), 10% recompute."""

    opened = 0

    def __init__(self, model: FakeModel) -> None:
        self.model = model
        self.entered = False
        self.value: StepFlopsValue | None = None

    def __enter__(self) -> FakeSession:
        FakeSession.opened += 1
        self.entered = True
        return self

    def __exit__(self, *exc: object) -> None:
        self.value = StepFlopsValue(self.model.batch * 1e9, self.model.batch * 1e8, "counted")

    def recompute_context(self) -> contextlib.AbstractContextManager[Any]:
        return contextlib.nullcontext()

    @property
    def result(self) -> StepFlopsValue:
        assert self.value is not None
        return self.value


class Shape:
    def __init__(self, *dims: int) -> None:
        self.shape = dims


class FakeModel:
    """Calls its forward pre-hook like nn.Module does."""

    def __init__(self) -> None:
        self.batch = 8
        self.hook: Callable[..., None] | None = None

    def register_forward_pre_hook(self, hook: Callable[..., None], with_kwargs: bool) -> Any:
        assert with_kwargs
        self.hook = hook
        return self

    def remove(self) -> None:
        self.hook = None

    def forward(self) -> None:
        if self.hook is not None:
            self.hook(self, (Shape(self.batch, 128), "not a tensor"), {"mask": Shape(self.batch)})


def _tracker(model: FakeModel, **kwargs: Any) -> FlopsTracker:
    return FlopsTracker(
        given=kwargs.pop("given", None),
        new_session=lambda: FakeSession(model),
        log=RateLimitedLog(60.0),
        model=model,
        **kwargs,
    )


def _run(tracker: FlopsTracker, model: FakeModel, batch: int) -> tuple[float, float, str]:
    model.batch = batch
    tracker.begin_step()
    model.forward()
    value = tracker.end_step()
    return value.model_flops, value.recompute_flops, value.source


def test_given_flops_are_never_counted() -> None:
    model = FakeModel()
    tracker = _tracker(model, given=(5.0, 1.0))
    before = FakeSession.opened
    assert not tracker.counting
    assert _run(tracker, model, 8) == (5.0, 1.0, "given")
    assert FakeSession.opened == before
    assert model.hook is None  # no shape watching needed


def test_counts_once_then_each_new_shape_on_its_own_step() -> None:
    model = FakeModel()
    tracker = _tracker(model)
    assert tracker.counting
    opened = FakeSession.opened
    assert _run(tracker, model, 8) == (8e9, 8e8, "counted")
    assert _run(tracker, model, 8) == (8e9, 8e8, "counted")
    assert not tracker.counting
    # shapes change: the step starts counting at its first forward and carries its own count
    assert _run(tracker, model, 4) == (4e9, 4e8, "counted")
    # both shape sets are now known: switching back and forth costs no count
    assert _run(tracker, model, 8) == (8e9, 8e8, "counted")
    assert _run(tracker, model, 4) == (4e9, 4e8, "counted")
    assert FakeSession.opened - opened == 2
    assert not tracker.counting
    tracker.close()
    assert model.hook is None


def test_cycling_shapes_each_get_their_own_count() -> None:
    # A step with new shapes used to carry the previous count and make the *next* step a
    # counting step: with shapes cycling A, B, C that next step was C, so B was never counted.
    model = FakeModel()
    tracker = _tracker(model)
    for batch in (8, 4, 2) * 4:
        assert _run(tracker, model, batch) == (batch * 1e9, batch * 1e8, "counted")


def test_forwards_while_counting_is_paused_are_not_the_steps_shapes() -> None:
    # A pipeline stage's one-time metadata pass runs a forward in the first step only (paused:
    # `mfuscope.agent._uncounted`). Taken into that step's signature, it made the second step look
    # new, so the third became a counting step (and no profiled window could open on it).
    from mfuscope.agent import _uncounted as uncounted

    model = FakeModel()
    tracker = _tracker(model)
    opened = FakeSession.opened
    tracker.begin_step()
    with uncounted.pause():
        model.forward()
    model.forward()
    tracker.end_step()
    assert _run(tracker, model, 8) == (8e9, 8e8, "counted")
    assert not tracker.counting
    assert FakeSession.opened - opened == 1


def test_recounts_stop_at_the_limit() -> None:
    model = FakeModel()
    tracker = _tracker(model, max_recounts=2)
    _run(tracker, model, 1)
    assert _run(tracker, model, 2) == (2e9, 2e8, "counted")
    assert _run(tracker, model, 3) == (2e9, 2e8, "stale")
    assert not tracker.counting


def test_shapes_diverging_after_the_first_forward_are_counted_on_the_next_step() -> None:
    # Only the first forward decides whether a step starts counting (earlier ops would be lost
    # otherwise): a step whose later forwards are new carries the latest count, and the next step
    # is counted from its beginning.
    model = FakeModel()
    tracker = _tracker(model)

    def accumulate(first: int, second: int) -> tuple[float, float, str]:
        tracker.begin_step()
        model.batch = first
        model.forward()
        model.batch = second
        model.forward()
        value = tracker.end_step()
        return value.model_flops, value.recompute_flops, value.source

    assert accumulate(8, 8) == (8e9, 8e8, "counted")
    assert accumulate(8, 2) == (8e9, 8e8, "stale")
    assert tracker.counting
    assert accumulate(8, 2) == (2e9, 2e8, "counted")  # the fake counts the last batch
    assert accumulate(8, 2) == (2e9, 2e8, "counted")


def test_no_count_starts_inside_a_window_or_under_a_new_dispatch_mode() -> None:
    model = FakeModel()
    window = [False]
    modes: list[str] = []
    tracker = _tracker(model, may_count_now=lambda: not window[0], mode_stack=lambda: tuple(modes))
    _run(tracker, model, 8)
    window[0] = True  # a profiled window opened after the step began
    assert _run(tracker, model, 4)[2] == "stale"
    window[0] = False
    tracker.begin_step(allow_count=False)  # the pending count waits for an allowed step
    model.forward()
    assert tracker.end_step().source == "stale"
    _run(tracker, model, 8)  # counted from its beginning (pending), shapes known
    tracker.begin_step()
    modes.append("user mode pushed inside the step")  # must leave the stack in order: no count
    model.batch = 2
    model.forward()
    assert tracker.end_step().source == "stale"
    modes.clear()
    assert _run(tracker, model, 2) == (2e9, 2e8, "counted")


def test_flops_given_for_one_step_take_precedence_and_are_not_counted() -> None:
    model = FakeModel()
    tracker = _tracker(model)
    opened = FakeSession.opened
    tracker.begin_step(allow_count=False)
    model.forward()
    given = StepFlopsValue(5.0, 1.0, "given")
    assert tracker.end_step(given=given) == given
    assert FakeSession.opened == opened  # the first count still waits for a step of its own
    assert tracker.counting
    assert _run(tracker, model, 8) == (8e9, 8e8, "counted")
    tracker.begin_step(allow_count=False)
    model.batch = 3
    model.forward()  # new shapes, but the step's FLOPs are given: nothing is counted
    assert tracker.end_step(given=given) == given
    assert FakeSession.opened == opened + 1


def test_a_raising_step_is_not_kept_and_counting_is_retried() -> None:
    model = FakeModel()
    tracker = _tracker(model)
    tracker.begin_step()
    value = tracker.end_step(failed=True)
    assert value.source == "unknown" and tracker.counting
    assert _run(tracker, model, 8)[2] == "counted"


def test_a_failing_counter_is_given_up_after_three_tries() -> None:
    model = FakeModel()
    tracker = _tracker(model)
    for _ in range(3):
        assert tracker.counting
        tracker.begin_step()
        tracker.abort()
    assert not tracker.counting


@pytest.mark.parametrize(
    ("args", "kwargs", "expected"),
    [
        ((Shape(2, 3),), {}, ((2, 3),)),
        ((1, "x", None), {}, ()),
        ((Shape(4),), {"y": Shape(5, 6)}, ((4,), (5, 6))),
    ],
)
def test_input_signature(args: tuple[Any, ...], kwargs: dict[str, Any], expected: Any) -> None:
    assert input_signature(args, kwargs) == expected
