"""When profiled windows open: on the same steps on every rank, agreed without a collective.

Why the same steps: profiling slows the rank that does it (the profiler's own work), and in
synchronous training its peers wait for it at the next collective. A window taken on one rank
alone therefore measures a rank that is late to every collective (it sees little exposed comm)
while its peers, unprofiled, absorb the wait. When every rank profiles the same steps, all pay the
slowdown in the same steps and each rank's decomposition describes the job (docs/agent.md,
"Profiled windows").

How (all step numbers in rank 0's numbering, see `ScheduleParams`):

- Window 0 opens at `first_window_step`, a parameter every rank got from rank 0 at start.
- Each later window start is a *decision* taken at the end of a *check step*. The first check for
  window w+1 is the last step of window w. There every rank computes the step where it would like
  window w+1 to start (its own view: cadence, measured costs, an analysis still out) and offers it
  to `Agreement.decide` under a key naming (w+1, check step). The agreement keeps the first offer
  made under a key and hands that same value to every rank (compare-and-set, first writer wins),
  so all ranks hold the same answer V whatever their views were.
- If V is the step after the check, window w+1 opens there. Otherwise the next check is halfway
  to V (at V - 1 at the latest), where every rank offers afresh (with the step times and costs
  measured since), and so on: about log2(gap) decisions per window. Every check step is a pure
  function of earlier answers, so all ranks ask the same keys at the same steps.
- Each rank marks every window done (`window_done`: a store counter) once it is through with it;
  while the count is short of the ranks following the schedule, an offer to open at once becomes
  a postponement by the time the analyses have taken so far, so a slow analysis on one rank
  delays everyone's next window instead of making that rank skip it.

The overhead budget survives the agreement: before offering, a rank reads the largest cost any
rank published for the latest window (`Agreement.raise_to` keeps a maximum), so even the first
writer's offer respects the most expensive rank's budget, `cost / max_overhead_ratio` seconds
between window starts, converted to steps with the offering rank's median step period. A cost
published after the first writer read it is used at the next check or window.

No deadlock: `decide`, `raise_to` and `read` are single operations on the job's key-value store
that wait for no other rank (a rank that never asks leaves nobody waiting), nothing is sent on a
process group (the user's collectives cannot be mismatched, and no profiled trace holds ours), and
there are no collectives besides the one at start. A rank whose agreement fails stops profiling
for the rest of the launch rather than guess steps.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

__all__ = [
    "Agreement",
    "AgreementError",
    "AlignedSchedule",
    "LocalAgreement",
    "RankView",
    "ScheduleParams",
]


class AgreementError(RuntimeError):
    """The agreement could not give an answer (store unreachable, a malformed value)."""


class Agreement(Protocol):
    """Values every rank of one launch reads alike (keys are already scoped to the launch)."""

    def decide(self, key: str, offer: int) -> int:
        """The first offer ever made under `key`, returned to every caller (this one included)."""
        ...

    def raise_to(self, key: str, value: float) -> None:
        """Make `key` hold at least `value` (the maximum of every value raised to)."""
        ...

    def count(self, key: str) -> None:
        """Add 1 to the counter `key` (absent: 0)."""
        ...

    def read(self, key: str) -> float | None:
        """The value `raise_to` or `count` built under `key`, None when nobody did yet."""
        ...


class LocalAgreement:
    """In-process agreement: a single process, or simulated ranks sharing one instance."""

    def __init__(self) -> None:
        self.values: dict[str, float] = {}

    def decide(self, key: str, offer: int) -> int:
        return int(self.values.setdefault(key, offer))

    def raise_to(self, key: str, value: float) -> None:
        self.values[key] = max(self.values.get(key, value), value)

    def count(self, key: str) -> None:
        self.values[key] = self.values.get(key, 0) + 1

    def read(self, key: str) -> float | None:
        return self.values.get(key)


@dataclass(frozen=True)
class ScheduleParams:
    """The schedule's inputs every rank holds alike (rank 0's options, handed out at start).

    `first_window_step`: step of the first window, in rank 0's step numbering. Then a window
    every `every_steps` steps or `every_s` seconds since the last one started, whichever comes
    first, but never sooner than (the largest window cost a rank measured) / `max_overhead_ratio`
    seconds after it. `window_steps`: steps per window.
    """

    first_window_step: int
    every_steps: int
    every_s: float
    window_steps: int
    max_overhead_ratio: float

    def __post_init__(self) -> None:
        if self.every_steps < 1 or self.window_steps < 1:
            raise ValueError("every_steps and window_steps must be >= 1")
        if not (math.isfinite(self.every_s) and self.every_s >= 0):
            raise ValueError(f"every_s must be a finite number of seconds >= 0: {self.every_s}")
        if not 0 < self.max_overhead_ratio <= 1:
            raise ValueError(f"max_overhead_ratio must be in (0, 1]: {self.max_overhead_ratio}")


@dataclass(frozen=True)
class RankView:
    """What one rank knows when it offers a start; it may differ from rank to rank.

    `step_s`: its median period of recent steps outside windows (s; None: none measured yet).
    `cost_s`: its measured cost of its latest measured window (s).
    """

    step_s: float | None = None
    cost_s: float | None = None


class AlignedSchedule:
    """The agreed window starts, followed step by step on one rank (training thread).

    `step_offset` = this rank's step number minus rank 0's for the same step (0 unless the ranks
    were started with different `first_step`s): windows align on the same training step, not on
    the same number. `members`: how many ranks follow the schedule (each marks every window
    done, `window_done`). `enabled=False` (profiling off on rank 0): no window ever opens.
    """

    def __init__(
        self,
        params: ScheduleParams,
        agreement: Agreement,
        *,
        step_offset: int = 0,
        members: int = 1,
        enabled: bool = True,
    ) -> None:
        self._params = params
        self._agreement = agreement
        self._offset = step_offset
        self._window = 0  # index of the next window to open
        self._start = params.first_window_step if enabled else None  # its start, once agreed
        self._starts: list[int] = []  # starts of the windows opened so far, latest last
        self._check: int | None = None  # step at whose end the next decision is taken
        self._members = members
        self._done: int | None = None  # latest window this rank marked done
        self.failure: str | None = None  # why this rank left the agreement (None: it did not)

    @property
    def params(self) -> ScheduleParams:
        return self._params

    def opens_at(self, step: int) -> bool:
        """Whether an agreed window begins at this rank's `step`."""
        return self._start is not None and step - self._offset == self._start

    def step_ended(self, step: int, view: Callable[[], RankView]) -> None:
        """Follow the agreed chain past this rank's `step` (every step, recorded or not).

        `view` is called only at check steps. Raises nothing; a failed agreement sets
        `failure` and ends the schedule (no more windows on this rank).
        """
        at = step - self._offset
        if self._start is not None and at == self._start:
            self._starts = [*self._starts[-1:], at]
            self._window += 1
            self._start = None
            self._check = at + self._params.window_steps - 1
        if self._check is None or at != self._check:
            return
        try:
            offer = self._offer(at, view())
            agreed = self._agreement.decide(f"start/{self._window}/{at}", offer)
        except AgreementError as exc:
            self._leave(str(exc))
            return
        if agreed <= at:
            self._leave(f"agreed window start {agreed} is not after check step {at}")
        elif agreed == at + 1:
            self._start, self._check = agreed, None
        else:
            # Decide afresh halfway there, and at the step before the answer at the latest: a
            # cadence in seconds follows a changed step time, a cost measured since counts, in
            # about log2(gap) decisions per window.
            self._check = at + max(1, (agreed - at) // 2)

    def record_cost(self, window_start: int, cost_s: float) -> None:
        """Publish this rank's measured cost (s) of the window that began at its step
        `window_start`; the budget uses the largest any rank published.

        Raises `AgreementError` when it cannot be published (the schedule carries on: a missing
        cost only makes other ranks' offers less informed, never different from each other).
        """
        if self.failure is None and math.isfinite(cost_s) and cost_s >= 0:
            self._agreement.raise_to(f"cost/{window_start - self._offset}", cost_s)

    def window_done(self) -> None:
        """This rank is through with the latest window (analysed, failed, skipped or not
        recorded at all) and has published its cost if it had one. Idempotent.

        Raises `AgreementError` when the mark cannot be made (other ranks then wait longer
        before the next window, never differently from each other).
        """
        if self.failure is not None or not self._starts or self._done == self._starts[-1]:
            return
        self._done = self._starts[-1]
        self._agreement.count(f"done/{self._done}")

    def _offer(self, check: int, view: RankView) -> int:
        """The start this rank would pick for the next window, from its own view."""
        params = self._params
        last = self._starts[-1]
        gap = params.every_steps
        if view.step_s is not None and view.step_s > 0:
            gap = min(gap, math.ceil(params.every_s / view.step_s))
            cost_s = self._largest_cost(view.cost_s)
            if cost_s > 0:
                budget_s = cost_s / params.max_overhead_ratio
                gap = max(gap, math.ceil(budget_s / view.step_s))
        offer = max(last + gap, last + params.window_steps, check + 1)
        window_end = last + params.window_steps - 1
        if offer == check + 1 and check > window_end and self._done_count(last) < self._members:
            # A rank's analysis outlived the wait the cadence and budget gave it (its cost is
            # not in yet, and it would have to skip this window): wait as long again.
            offer += check - window_end
        return offer

    def _done_count(self, start: int) -> float:
        try:
            done = self._agreement.read(f"done/{start}")
        except AgreementError:
            return 0.0  # unknown: wait, as for a rank that is not done
        return done or 0.0

    def _largest_cost(self, own_cost_s: float | None) -> float:
        """The largest cost (s) any rank published for the latest window that has one (the
        window before it while none has; this rank's own costs are among them), else this
        rank's own latest cost (its publishing failed)."""
        for start in reversed(self._starts):
            try:
                published = self._agreement.read(f"cost/{start}")
            except AgreementError:
                published = None  # unknown: the offer uses what is known
            if published is not None:
                return published
        return own_cost_s or 0.0

    def _leave(self, reason: str) -> None:
        self.failure = reason
        self._start = self._check = None
