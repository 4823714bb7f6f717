"""A FLOP-counting session that spans one `with agent.step():` block (imports torch).

`mfuscope.agent.flop_counting.count_step_flops(step_fn)` needs the step as a function; the agent
only sees a step's beginning and end. This session composes the same public pieces
(`FlopCounterMode` with `cpu_attention_flop_mapping()`, and a `RecomputeCounter` whose context
the agent's `checkpoint_context()` enters around recomputation), entered at step begin and left at
step end, so the user's step runs once. As in `count_step_flops`, the outer counter also sees the
recomputed ops (nested dispatch modes both count), so ``model = total - recompute``.
"""

from __future__ import annotations

import contextlib
from typing import Any

from mfuscope.agent.flop_counting import RecomputeCounter, cpu_attention_flop_mapping

__all__ = ["StepCountSession"]


class StepCountSession:
    """Implements `mfuscope.agent.flops_tracker.CountSession`."""

    def __init__(self) -> None:
        from torch.utils.flop_counter import FlopCounterMode

        self._mode = FlopCounterMode(display=False, custom_mapping=cpu_attention_flop_mapping())
        self._recompute = RecomputeCounter()
        self._result: tuple[float, float] | None = None

    def __enter__(self) -> StepCountSession:
        self._mode.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self._mode.__exit__(None, None, None)
        total = float(self._mode.get_total_flops())
        recompute = float(self._recompute.total_flops)
        self._result = (max(total - recompute, 0.0), recompute)

    def recompute_context(self) -> contextlib.AbstractContextManager[Any]:
        return self._recompute.context()

    def result(self) -> tuple[float, float]:
        if self._result is None:
            raise RuntimeError("the counting session has not ended")
        return self._result
