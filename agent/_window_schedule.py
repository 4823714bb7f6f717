"""When profiled windows open: on the same steps on every rank, agreed without a collective.

Why the same steps: profiling slows the rank that does it (the profiler's own work), and in
synchronous training its peers wait for it at the next collective. A window taken on one rank
alone therefore measures a rank that is late to every collective (it sees little exposed comm)
while its peers, unprofiled, absorb the wait. When every rank profiles the same steps, all pay the
slowdown in the same steps and each rank's decomposition describes the job (docs/agent.md,
"Profiled windows").

How (all step numbers in rank 0's numbering, see `ScheduleParams`):

- Window 0 opens at `first_window_step`, a parameter every rank got from rank 0 at start.
- Each later window start is a *decision* taken by one rank, the *decider* (rank 0), at the end
  of a *check step* and published under a key naming (window, check step). The first check for
  window w+1 is the last step of window w. There the decider computes the step where window w+1
  should start (cadence, the largest cost any rank published, analyses still out) and publishes
  it; the start is at least `DECISION_LEAD_STEPS` steps after the check.
- Every other rank (a *follower*) asks for that key at the end of the same check step and reads
  the answer at the end of the step `DECISION_LEAD_STEPS - 1` later, the last step before the
  answer can take effect: in between, the `Agreement` fetches it off the training thread, so no
  rank waits on a round trip at a check step. An answer that is not in by then (a follower far
  ahead of the decider, a slow store) is read at each following step until it is; a start it
  learns too late is skipped on that rank alone, and the chain goes on, so its later windows are
  the same as everyone's.
- If the start is the soonest a decision allows (one lead after the check), window w+1 opens
  there. Otherwise the next check is halfway to it, and one lead before it at the latest, where
  the decider decides afresh (with the step times and costs measured since), and so on: about
  log2(gap) decisions per window. Every check step is a pure function of earlier answers, so all
  ranks ask for the same keys at the same steps.
- Each rank marks every window done (`window_done`: a store counter) once it is through with it;
  while the count is short of the ranks following the schedule, a start due as soon as possible
  becomes a postponement by the time the analyses have taken so far, so a slow analysis on one
  rank delays everyone's next window instead of making that rank skip it.

The overhead budget covers every rank: each publishes its measured window cost
(`Agreement.raise_to` keeps the maximum), and the decider's budget is the largest, `cost /
max_overhead_ratio` seconds between window starts, converted to steps with its median step
period. The decider reads the costs and done counts the store held at its previous check (they
are refreshed off the training thread); a value published since counts at its next check.

No deadlock and no wait: publishing, fetching, raising and counting are queued to a thread of the
`Agreement` (`mfuscope.agent._store_agreement`) and wait for no other rank; nothing is sent on a
process group (the user's collectives cannot be mismatched, and no profiled trace holds ours), and
there are no collectives besides the one at start. A rank whose agreement fails stops profiling
for the rest of the launch rather than guess steps; a decider that stops publishes so, and its
followers stop too.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

__all__ = [
    "DECISION_LEAD_STEPS",
    "STOPPED",
    "Agreement",
    "AgreementError",
    "AlignedSchedule",
    "LocalAgreement",
    "RankView",
    "ScheduleParams",
]


# A decided start takes effect at least this many steps after its check step: followers fetch
# the decision during the steps in between, off the training thread.
DECISION_LEAD_STEPS = 2
# Published instead of a start by a decider that stops: its followers stop too.
STOPPED = -1


class AgreementError(RuntimeError):
    """The agreement could not give an answer (store unreachable, a malformed value)."""


class Agreement(Protocol):
    """Values every rank of one launch reads alike (keys are already scoped to the launch).

    An implementation may complete `publish`, `raise_to` and `count` after returning, and fetch
    in the background; any call raises `AgreementError` once the agreement has failed.
    """

    def publish(self, key: str, value: int) -> None:
        """The decider: make `key` hold `value` for every rank."""
        ...

    def fetch(self, key: str) -> None:
        """A follower: start fetching `key`, which the decider publishes (maybe later)."""
        ...

    def fetched(self, key: str) -> int | None:
        """The value published under a fetched `key`; None while it is not in (never waits)."""
        ...

    def raise_to(self, key: str, value: float) -> None:
        """Make `key` hold at least `value` (the maximum of every value raised to)."""
        ...

    def count(self, key: str) -> None:
        """Add 1 to the counter `key` (absent: 0)."""
        ...

    def read(self, key: str) -> float | None:
        """The value `raise_to` or `count` built under `key` (None when nobody did yet), as of
        this call or of the previous `read` of `key` (it may refresh in the background)."""
        ...

    def close(self) -> None:
        """Stop whatever runs in the background; never raises."""
        ...


class LocalAgreement:
    """In-process agreement: a single process, or simulated ranks sharing one instance."""

    def __init__(self) -> None:
        self.values: dict[str, float] = {}

    def publish(self, key: str, value: int) -> None:
        self.values[key] = value

    def fetch(self, key: str) -> None:
        pass

    def fetched(self, key: str) -> int | None:
        value = self.values.get(key)
        return None if value is None else int(value)

    def raise_to(self, key: str, value: float) -> None:
        self.values[key] = max(self.values.get(key, value), value)

    def count(self, key: str) -> None:
        self.values[key] = self.values.get(key, 0) + 1

    def read(self, key: str) -> float | None:
        return self.values.get(key)

    def close(self) -> None:
        pass


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
    `decider`: this rank takes the decisions (rank 0; a single process decides alone).
    `on_missed`: told (a line for the log) of each window this rank learnt of too late.
    """

    def __init__(
        self,
        params: ScheduleParams,
        agreement: Agreement,
        *,
        step_offset: int = 0,
        members: int = 1,
        enabled: bool = True,
        decider: bool = True,
        on_missed: Callable[[str], object] | None = None,
    ) -> None:
        self._params = params
        self._agreement = agreement
        self._offset = step_offset
        self._decider = decider
        self._window = 0  # index of the next window to open
        self._start = params.first_window_step if enabled else None  # its start, once agreed
        self._starts: list[int] = []  # starts of the windows opened so far, latest last
        self._check: int | None = None  # check step of the pending decision
        self._next: int | None = None  # step at whose end this rank acts on it next
        self._fetching = False  # a follower asked for the pending decision
        self._members = members
        self._done: int | None = None  # latest window this rank marked done
        self.failure: str | None = None  # why this rank left the agreement (None: it did not)
        self.missed = 0  # windows this follower learnt of too late
        self._on_missed = on_missed

    @property
    def params(self) -> ScheduleParams:
        return self._params

    def opens_at(self, step: int) -> bool:
        """Whether an agreed window begins at this rank's `step`."""
        return self._start is not None and step - self._offset == self._start

    def next_action_step(self) -> int | None:
        """This rank's next step at which `opens_at` can hold or `step_ended` acts (a window
        start, a check step, a step to read a decision at); None while none is planned. The
        steps before it need neither call (the agent's step recorder skips them)."""
        planned = [at for at in (self._start, self._next) if at is not None]
        return min(planned) + self._offset if planned else None

    @property
    def done_pending(self) -> bool:
        """Whether this rank has a window to mark done (`window_done` would count one)."""
        return self.failure is None and bool(self._starts) and self._done != self._starts[-1]

    def step_ended(self, step: int, view: Callable[[], RankView]) -> None:
        """Follow the agreed chain past this rank's `step` (every step, recorded or not).

        `view` is called only when the decider decides. Raises nothing; a failed agreement
        sets `failure` and ends the schedule (no more windows on this rank).
        """
        at = step - self._offset
        if self._start is not None and at == self._start:
            self._opened(at)
        while self._next is not None and at >= self._next:
            try:
                self._act(at, view)
            except AgreementError as exc:
                self._leave(str(exc))

    def record_cost(self, window_start: int, cost_s: float) -> None:
        """Publish this rank's measured cost (s) of the window that began at its step
        `window_start`; the budget uses the largest any rank published.

        Raises `AgreementError` when it cannot be published (the schedule carries on: a missing
        cost only makes the decisions less informed, never different between ranks).
        """
        if self.failure is None and math.isfinite(cost_s) and cost_s >= 0:
            self._agreement.raise_to(f"cost/{window_start - self._offset}", cost_s)

    def window_done(self) -> None:
        """This rank is through with the latest window (analysed, failed, skipped or not
        recorded at all) and has published its cost if it had one. Idempotent.

        Raises `AgreementError` when the mark cannot be made (the next window then waits
        longer, alike for every rank).
        """
        if self.failure is not None or not self._starts or self._done == self._starts[-1]:
            return
        self._done = self._starts[-1]
        self._agreement.count(f"done/{self._done}")

    def close(self) -> None:
        """At the end of training: a decider tells its followers no decision will come; the
        agreement's background work stops. Never raises."""
        if self._decider and self._check is not None and self.failure is None:
            with contextlib.suppress(AgreementError):
                self._agreement.publish(self._key(), STOPPED)
        self._start = self._check = self._next = None
        with contextlib.suppress(Exception):
            self._agreement.close()

    # --- the chain ------------------------------------------------------------------------------

    def _opened(self, at: int) -> None:
        """Window `self._window` began at `at` (here, or on the other ranks when this rank
        learnt of it too late); its last step is the first check for the next one."""
        self._starts = [*self._starts[-1:], at]
        self._window += 1
        self._start = None
        self._await(at + self._params.window_steps - 1)

    def _await(self, check: int) -> None:
        self._check, self._next, self._fetching = check, check, False

    def _key(self) -> str:
        return f"start/{self._window}/{self._check}"

    def _act(self, at: int, view: Callable[[], RankView]) -> None:
        """This rank's part in the pending decision at the end of its step `at`."""
        check = self._check
        assert check is not None
        if self._decider:
            decided = self._offer(check, view())
            self._agreement.publish(self._key(), decided)
            self._take(check, decided, at)
        elif not self._fetching:
            self._agreement.fetch(self._key())
            self._fetching = True
            self._next = check + DECISION_LEAD_STEPS - 1
        else:
            answer = self._agreement.fetched(self._key())
            if answer is None:
                self._next = at + 1  # late: look again after the next step
            else:
                self._take(check, answer, at)

    def _take(self, check: int, start: int, at: int) -> None:
        """Follow the answer `start` to the decision at `check`, known at the end of `at`."""
        if start == STOPPED:
            self._leave("rank 0 stopped deciding profiled windows")
        elif start < check + DECISION_LEAD_STEPS:
            self._leave(f"agreed window start {start} is too soon after check step {check}")
        elif start == check + DECISION_LEAD_STEPS:
            if start > at:
                self._start, self._check, self._next = start, None, None
            else:  # a follower that learnt of it too late: the others profile it, not this rank
                self.missed += 1
                if self._on_missed is not None:
                    self._on_missed(
                        f"profiled window at step {start + self._offset} skipped on this rank "
                        "(rank 0's decision arrived after it)"
                    )
                self._opened(start)
        else:
            # Decide afresh halfway there, and one lead before the answer at the latest: a
            # cadence in seconds follows a changed step time, a cost measured since counts, in
            # about log2(gap) decisions per window.
            self._await(min(check + (start - check) // 2, start - DECISION_LEAD_STEPS))

    def _offer(self, check: int, view: RankView) -> int:
        """The start the decider picks for the next window, from its view."""
        params = self._params
        last = self._starts[-1]
        gap = params.every_steps
        done = self._done_count(last)  # read at every decision: refreshed for the next one
        if view.step_s is not None and view.step_s > 0:
            gap = min(gap, math.ceil(params.every_s / view.step_s))
            cost_s = self._largest_cost(view.cost_s)
            if cost_s > 0:
                budget_s = cost_s / params.max_overhead_ratio
                gap = max(gap, math.ceil(budget_s / view.step_s))
        offer = max(last + gap, last + params.window_steps, check + DECISION_LEAD_STEPS)
        window_end = last + params.window_steps - 1
        if offer == check + DECISION_LEAD_STEPS and check > window_end and done < self._members:
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
        found = None
        for start in reversed(self._starts):  # both read: each refreshes for the next decision
            try:
                published = self._agreement.read(f"cost/{start}")
            except AgreementError:
                published = None  # unknown: the offer uses what is known
            if found is None:
                found = published
        return found if found is not None else (own_cost_s or 0.0)

    def _leave(self, reason: str) -> None:
        if self._decider and self._check is not None:  # tell the followers, if it still can
            with contextlib.suppress(AgreementError):
                self._agreement.publish(self._key(), STOPPED)
        self.failure = reason
        self._start = self._check = self._next = None
