"""Flight-recorder traffic of one job: each rank's cumulative totals turned into increments.

An agent sends its traffic totals cumulative since it started reading (`CollectiveTraffic`), in
every batch. The ledger keeps each rank's latest totals and returns what grew since, so the
job's counters add every collective once: a batch the collector never got loses nothing (the
next one carries it), a re-sent batch adds nothing. Totals that fall, or a key that disappears,
come from a new agent process (a restart): its totals count from zero. A rank's entry stays while
its job lives, like the health ledger's, so a rank that returns continues where it was.
"""

from __future__ import annotations

import msgspec
from mfuscope.core.collective_records import CollectiveTraffic

__all__ = ["TrafficLedger"]

_Key = tuple[str, str, str, int | None]


def _key(t: CollectiveTraffic) -> _Key:
    return (t.op, t.axis, t.tier, t.group_size)


def _fell(new: CollectiveTraffic, old: CollectiveTraffic) -> bool:
    return (
        new.calls < old.calls
        or new.bytes < old.bytes
        or new.seconds < old.seconds
        or new.sized_seconds < old.sized_seconds
        or new.sized_bytes < old.sized_bytes
    )


class TrafficLedger:
    __slots__ = ("_last",)

    def __init__(self) -> None:
        self._last: dict[int, dict[_Key, CollectiveTraffic]] = {}

    def increments(
        self, rank: int, traffic: tuple[CollectiveTraffic, ...]
    ) -> list[CollectiveTraffic]:
        """What `rank`'s totals added since its previous batch (only the keys that grew)."""
        old = self._last.get(rank, {})
        new = {_key(t): t for t in traffic}
        if any(k not in new for k in old) or any(
            k in old and _fell(t, old[k]) for k, t in new.items()
        ):
            old = {}  # a restarted agent: its totals are all new
        self._last[rank] = new
        grown = []
        for key, t in new.items():
            before = old.get(key)
            if before is None:
                if t.calls or t.bytes or t.seconds:
                    grown.append(t)
            elif t != before:
                grown.append(
                    msgspec.structs.replace(
                        t,
                        calls=t.calls - before.calls,
                        bytes=t.bytes - before.bytes,
                        seconds=t.seconds - before.seconds,
                        sized_seconds=t.sized_seconds - before.sized_seconds,
                        sized_bytes=t.sized_bytes - before.sized_bytes,
                    )
                )
        return grown
