"""Restarts: which step reports are re-sends and which are steps a relaunched job ran again.

A job that crashes and resumes from its last checkpoint runs the steps since that checkpoint a
second time under the same job name. Each launch of the agents carries its own *incarnation*
(wire field ``incarnation``; ``""`` for agents that predate it), so the idempotency key is
``(job, incarnation, rank, step)``. The rules, per job:

- Incarnations are numbered in the order this collector first sees them. The first is the
  launch; every later new one is a restart (`JobIncarnations.restarts`).
- Per rank, each of the job's `KEEP` newest incarnations has its own `SeenSteps`: a step
  already in its incarnation's window is a re-send (a duplicate, not counted); any other step is
  counted as new work (steps, seconds, FLOPs).
- A counted step is also *redone* (a rerun) when its number is at or below the highest step this
  rank reported under an earlier incarnation: the relaunch resumed from an earlier checkpoint.
- Late batches of an older incarnation that is still kept (retries that land after the relaunch
  started) are deduplicated against that incarnation's own window and counted as the new work
  they are; they are not reruns (their incarnation came first). They raise the bar only for the
  newer incarnation's later reports, so a step the old launch reports only after the new one
  re-ran it is counted as work twice and as a rerun by neither: the rerun count may come out low
  in that race, never the work counters.
- Batches of an incarnation older than the `KEEP` newest are acknowledged as duplicates and not
  counted (as a step below its window is): too late to tell a re-send from new work, so never
  counted twice.

Memory stays bounded whatever the number of restarts: per job the names of the last `REMEMBER`
incarnations (an older one seen again would read as a new launch: at a restart a minute that is
over an hour late); per rank at most `KEEP` windows (512 bytes each at the default width) and
the highest step of the windows already dropped. No label or series is made per incarnation.
"""

from __future__ import annotations

from collections import OrderedDict

from mfuscope.collector._seen_steps import SeenSteps

__all__ = ["KEEP", "REMEMBER", "JobIncarnations", "RankIncarnations"]

KEEP = 3
REMEMBER = 64


class JobIncarnations:
    """The incarnations one job has run under, numbered by first arrival (mutable)."""

    __slots__ = ("_next", "_number_of")

    def __init__(self) -> None:
        self._number_of: OrderedDict[str, int] = OrderedDict()
        self._next = 0

    @property
    def restarts(self) -> int:
        """New incarnations after the first: the job's restarts, as this collector saw them."""
        return max(self._next - 1, 0)

    def number(self, incarnation: str) -> int:
        """The number of `incarnation`, registering it (and counting a restart) when new."""
        number = self._number_of.get(incarnation)
        if number is None:
            number = self._number_of[incarnation] = self._next
            self._next += 1
            if len(self._number_of) > REMEMBER:
                self._number_of.popitem(last=False)
        return number

    @property
    def oldest_kept(self) -> int:
        """The oldest incarnation number whose reports are still counted."""
        return max(self._next - KEEP, 0)


class RankIncarnations:
    """One rank's idempotency windows, one per kept incarnation (mutable)."""

    __slots__ = ("_dropped_high", "_width", "_windows")

    def __init__(self, width: int) -> None:
        self._width = width
        self._windows: dict[int, SeenSteps] = {}
        # The highest step reported under incarnations whose windows were dropped.
        self._dropped_high = -1

    def window(self, number: int, oldest_kept: int) -> tuple[SeenSteps | None, int]:
        """The window of incarnation `number` at this rank and the highest step this rank
        reported under earlier incarnations (-1 if none): a new step at or below it is a rerun.
        The window is None when `number` is older than `oldest_kept` (too late to count)."""
        for old in [n for n in self._windows if n < oldest_kept]:
            self._dropped_high = max(self._dropped_high, self._windows.pop(old).high)
        if number < oldest_kept:
            return None, -1
        window = self._windows.get(number)
        if window is None:
            window = self._windows[number] = SeenSteps(self._width)
        earlier = max((w.high for n, w in self._windows.items() if n < number), default=-1)
        return window, max(earlier, self._dropped_high)
