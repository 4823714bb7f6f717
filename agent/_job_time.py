"""The rank's own part of the job-time ledger (docs/definitions.md#job-time-ledger), kept on the
agent's periodic thread.

A rank's time is a row of regions on the step recorder's clock: startup (from the process start to
the first step), one per step (from its start to the next step's start; the last step to its own
end) and shutdown (from there to the agent's close). The phases the training thread logs
(`_phases`) are taken out of the region they fall in (`core.ledger.split_region`): what is left of
a step's region is its period, what is left of startup and shutdown is theirs. `JobTime` books
each region once it is closed (the next step began, or the agent closes), in integer nanoseconds,
and publishes the cumulative totals as the batches' `LedgerTotals`. The collector books the steps
(their periods come in the step reports) and what only it can see (hung, down).
"""

from __future__ import annotations

import bisect
from collections.abc import Callable

from mfuscope.agent._step_recorder import CAPACITY, StepRecorder
from mfuscope.core.ledger import AGENT_CATEGORIES, LedgerTotals, PhaseSpan, split_region

__all__ = ["JobTime"]

_INDEX = {category: i for i, category in enumerate(AGENT_CATEGORIES)}


class JobTime:
    """Books the regions of one rank's time (see the module docstring). `advance` runs where the
    step reports are built (the periodic thread; at close the closing thread, one at a time);
    `totals` is read by the transport threads (a record replaced whole: atomic)."""

    def __init__(self, recorder: StepRecorder, start_ns: int, start_unix_ns: int) -> None:
        """`start_ns`: the process start on the recorder's clock (`time.perf_counter_ns`);
        `start_unix_ns`: the same instant on the wall clock, sent with the totals."""
        self._recorder = recorder
        self._start_unix_ns = start_unix_ns
        self._pending: list[PhaseSpan] = []  # phases not booked yet, by start
        self._booked = 0  # step regions booked (in steps begun)
        self._stepped = False  # startup is booked: a step began
        self._cursor_ns = start_ns  # where the open startup or shutdown region begins
        self._ns = [0] * len(AGENT_CATEGORIES)
        self._phase_ns: dict[int, int] = {}  # step -> phase ns taken out of its period
        self.totals = LedgerTotals(process_start_unix_ns=start_unix_ns)

    def take_phase_ns(self, step: int) -> int:
        """The nanoseconds of phases taken out of `step`'s period (0 when none). Steps are asked
        in order, once each: what is kept for earlier ones (steps a device timer dropped) goes."""
        kept = self._phase_ns
        if len(kept) > 64:
            for old in [s for s in kept if s < step]:
                del kept[old]
        return kept.pop(step, 0)

    def advance(self, begun: int, final: bool, last_end_ns: int, now_ns: Callable[[], int]) -> None:
        """Book every region closed by now: each step's whose next step began (`begun`: steps
        begun, read before this call), the startup once a step began; `final` (the agent
        closes): the last step's, to `last_end_ns`, and shutdown (or a startup without steps)
        to `now_ns()`."""
        recorder = self._recorder
        log = recorder.phase_log
        while log:  # in order of their ends: a phase inside another ends first
            bisect.insort(self._pending, log.popleft())
        starts, first = recorder.starts, recorder.first_step
        n = self._booked
        if begun and not self._stepped:
            self._book(self._cursor_ns, starts[0], "startup")
            self._stepped = True
        if begun - n > CAPACITY:  # slots rewritten before they were read: those regions are lost
            n = begun - CAPACITY
        while n + 1 < begun:
            self._book_step(first + n, starts[n % CAPACITY], starts[(n + 1) % CAPACITY])
            n += 1
        if final and n < begun:
            self._book_step(first + n, starts[n % CAPACITY], last_end_ns)
            n += 1
            self._cursor_ns = last_end_ns
        self._booked = n
        if final:
            now = now_ns()
            self._book(self._cursor_ns, now, "shutdown" if self._stepped else "startup")
            self._cursor_ns = now
        self.totals = LedgerTotals(
            process_start_unix_ns=self._start_unix_ns,
            **{
                f"{category}_ns": ns
                for category, ns in zip(AGENT_CATEGORIES, self._ns, strict=True)
            },
        )

    def _split(self, start_ns: int, end_ns: int) -> int:
        """Book the phases in `[start_ns, end_ns)` (every pending one that began before its
        end), return the rest of the region."""
        pending = self._pending
        taken = bisect.bisect_left(pending, (end_ns,))
        rest, booked = split_region(start_ns, end_ns, pending[:taken])
        del pending[:taken]
        for category, ns in booked:
            self._ns[_INDEX[category]] += ns
        return rest

    def _book(self, start_ns: int, end_ns: int, owner: str) -> None:
        self._ns[_INDEX[owner]] += self._split(start_ns, end_ns)

    def _book_step(self, step: int, start_ns: int, end_ns: int) -> None:
        phase_ns = max(end_ns - start_ns, 0) - self._split(start_ns, end_ns)
        if phase_ns:
            self._phase_ns[step] = phase_ns
