"""The always-on collective records a report batch carries (wire schema since 1.2, optional).

An agent that reads the c10d flight recorder (docs/agent.md, "Collective records") adds to each
batch, as ``comm``::

    {"source": "flight_recorder", "durations": false, "status_interval_s": 10.0,
     "lost_total": 0, "p2p_recorded": false,
     "traffic": [{"op": "all_reduce", "axis": "dp", "tier": "inter_node", "group_size": 16,
                  "calls": 4812, "bytes": 504658329600, "seconds": 0.0,
                  "sized_seconds": 0.0, "sized_bytes": 0}],
     "groups": [{"group": "3", "axis": "dp", "tier": "inter_node", "size": 16,
                 "entered_seq": 4812, "completed_seq": 4811,
                 "pending": {"seq": 4812, "op": "all_reduce", "bytes": 104857600,
                             "waited_s": 94.2}}],
     "arrivals": [{"group": "3", "seq": 4790, "enqueued_unix_ns": 1763700000000000000}]}

- ``traffic``: cumulative since the agent started reading, per ``(op, axis, tier, group_size)``:
  every collective and point-to-point op the recorder saw complete, with its nccl-tests size S
  (``bytes``, over the calls whose size is known). Where the backend times ops (NCCL with
  timing on; ``durations``), ``seconds`` sums their durations, ``sized_seconds`` and
  ``sized_bytes`` those of the calls whose size is known too (the busbw pair). Cumulative values
  never decrease within one agent process: a lost batch loses nothing, a re-sent one adds nothing.
- ``groups``: this rank's progress on each process group it has used: the highest collective
  sequence number it entered and the highest it completed, and the oldest collective it entered
  and has not completed (``pending``, with how long it had waited when the batch was encoded, by
  the agent's own clock). ``op`` of a pending one is an nccl-tests op, ``barrier`` or ``other``.
- ``arrivals``: for each group, the first collective this rank completed in each step, with its
  enqueue time (the host's wall clock): joined across ranks on ``(group, seq)`` they give the
  arrival skew (docs/definitions.md#arrival-skew). Sent once each; a lost batch loses samples.
- ``status_interval_s``: how often the agent sends a batch while no step completes (a blocked
  rank keeps reporting); the collector treats a status older than three intervals as stale.
- ``lost_total``: recorder entries overwritten before the agent read them (cumulative).
- ``p2p_recorded``: whether the recorder records this rank's point-to-point ops (NCCL does; gloo
  does not, checked on torch 2.13): when false, send/recv still count from profiled windows.

``closing`` (a batch field, since 1.2): the agent is closing; the rank's job ended normally.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from mfuscope.core._fields import choice, entries, flag, integer, number, obj, required, text
from mfuscope.core.errors import SchemaError
from mfuscope.core.vocabulary import COLLECTIVE_OPS, TIERS

__all__ = [
    "COMM_SOURCES",
    "PENDING_OPS",
    "ArrivalSample",
    "CollectiveTraffic",
    "CommRecords",
    "GroupProgress",
    "PendingCollective",
    "parse_comm",
]

COMM_SOURCES: tuple[str, ...] = ("flight_recorder",)
# What a rank can be found waiting in: the data-moving ops, a barrier, or something else
# (a coalesced group of ops, an op mfuscope does not name).
PENDING_OPS: tuple[str, ...] = (*COLLECTIVE_OPS, "barrier", "other")

MAX_TRAFFIC_KEYS = 4_096
MAX_COMM_GROUPS = 256
MAX_ARRIVALS = 4_096
_MAX_SEQ = 1 << 62
_MAX_BYTES = 1 << 62  # cumulative over a long job: far beyond one report's bound
_MAX_SECONDS = 1e12
_MAX_WORLD = 1 << 20


@dataclass(frozen=True)
class CollectiveTraffic:
    op: str
    axis: str
    tier: str
    group_size: int | None  # None: the group is unknown, so no bus factor
    calls: int
    bytes: int
    seconds: float = 0.0
    sized_seconds: float = 0.0
    sized_bytes: int = 0


@dataclass(frozen=True)
class PendingCollective:
    seq: int
    op: str
    bytes: int | None
    waited_s: float


@dataclass(frozen=True)
class GroupProgress:
    group: str
    axis: str
    tier: str
    size: int | None
    entered_seq: int
    completed_seq: int
    pending: PendingCollective | None = None


@dataclass(frozen=True)
class ArrivalSample:
    group: str
    seq: int
    enqueued_unix_ns: int


@dataclass(frozen=True)
class CommRecords:
    source: str
    durations: bool
    status_interval_s: float
    lost_total: int = 0
    p2p_recorded: bool = False
    traffic: tuple[CollectiveTraffic, ...] = ()
    groups: tuple[GroupProgress, ...] = ()
    arrivals: tuple[ArrivalSample, ...] = ()


def _optional_int(value: Any, path: str, *, lo: int = 0, hi: int) -> int | None:
    return None if value is None else integer(value, path, lo=lo, hi=hi)


def _traffic(raw: Any, path: str) -> CollectiveTraffic:
    o = obj(raw, path)
    seconds = number(o.get("seconds", 0.0), f"{path}.seconds", hi=_MAX_SECONDS)
    # A part of `seconds`, summed apart: allow float rounding.
    sized_seconds = number(
        o.get("sized_seconds", 0.0), f"{path}.sized_seconds", hi=seconds * (1 + 1e-6) + 1e-9
    )
    return CollectiveTraffic(
        op=choice(required(o, "op", f"{path}."), f"{path}.op", COLLECTIVE_OPS),
        axis=text(required(o, "axis", f"{path}."), f"{path}.axis"),
        tier=choice(required(o, "tier", f"{path}."), f"{path}.tier", TIERS),
        group_size=_optional_int(o.get("group_size"), f"{path}.group_size", lo=1, hi=_MAX_WORLD),
        calls=integer(required(o, "calls", f"{path}."), f"{path}.calls", hi=_MAX_SEQ),
        bytes=integer(required(o, "bytes", f"{path}."), f"{path}.bytes", hi=_MAX_BYTES),
        seconds=seconds,
        sized_seconds=sized_seconds,
        sized_bytes=integer(o.get("sized_bytes", 0), f"{path}.sized_bytes", hi=_MAX_BYTES),
    )


def _pending(raw: Any, path: str) -> PendingCollective | None:
    if raw is None:
        return None
    o = obj(raw, path)
    return PendingCollective(
        seq=integer(required(o, "seq", f"{path}."), f"{path}.seq", hi=_MAX_SEQ),
        op=choice(required(o, "op", f"{path}."), f"{path}.op", PENDING_OPS),
        bytes=_optional_int(o.get("bytes"), f"{path}.bytes", hi=_MAX_BYTES),
        waited_s=number(required(o, "waited_s", f"{path}."), f"{path}.waited_s", hi=_MAX_SECONDS),
    )


def _group(raw: Any, path: str) -> GroupProgress:
    o = obj(raw, path)
    entered = integer(required(o, "entered_seq", f"{path}."), f"{path}.entered_seq", hi=_MAX_SEQ)
    pending = _pending(o.get("pending"), f"{path}.pending")
    if pending is not None and pending.seq > entered:
        raise SchemaError(f"{path}.pending.seq", f"{pending.seq} above entered_seq {entered}")
    return GroupProgress(
        group=text(required(o, "group", f"{path}."), f"{path}.group", allow_empty=True),
        axis=text(required(o, "axis", f"{path}."), f"{path}.axis"),
        tier=choice(required(o, "tier", f"{path}."), f"{path}.tier", TIERS),
        size=_optional_int(o.get("size"), f"{path}.size", lo=1, hi=_MAX_WORLD),
        entered_seq=entered,
        completed_seq=integer(
            required(o, "completed_seq", f"{path}."), f"{path}.completed_seq", hi=entered
        ),
        pending=pending,
    )


def _arrival(raw: Any, path: str) -> ArrivalSample:
    o = obj(raw, path)
    return ArrivalSample(
        group=text(required(o, "group", f"{path}."), f"{path}.group", allow_empty=True),
        seq=integer(required(o, "seq", f"{path}."), f"{path}.seq", hi=_MAX_SEQ),
        enqueued_unix_ns=integer(
            required(o, "enqueued_unix_ns", f"{path}."), f"{path}.enqueued_unix_ns"
        ),
    )


def parse_comm(raw: Any) -> CommRecords | None:
    """Validate a batch's ``comm`` value (None when absent). Raises `SchemaError`."""
    if raw is None:
        return None
    o = obj(raw, "comm")
    groups = tuple(
        _group(g, f"comm.groups[{i}]")
        for i, g in enumerate(entries(o.get("groups", []), "comm.groups", MAX_COMM_GROUPS))
    )
    if len({g.group for g in groups}) != len(groups):
        raise SchemaError("comm.groups", "a group appears twice")
    return CommRecords(
        source=choice(required(o, "source", "comm."), "comm.source", COMM_SOURCES),
        durations=flag(o.get("durations", False), "comm.durations"),
        status_interval_s=number(
            required(o, "status_interval_s", "comm."), "comm.status_interval_s", lo=0.1, hi=3600.0
        ),
        lost_total=integer(o.get("lost_total", 0), "comm.lost_total", hi=_MAX_SEQ),
        p2p_recorded=flag(o.get("p2p_recorded", False), "comm.p2p_recorded"),
        traffic=tuple(
            _traffic(t, f"comm.traffic[{i}]")
            for i, t in enumerate(entries(o.get("traffic", []), "comm.traffic", MAX_TRAFFIC_KEYS))
        ),
        groups=groups,
        arrivals=tuple(
            _arrival(a, f"comm.arrivals[{i}]")
            for i, a in enumerate(entries(o.get("arrivals", []), "comm.arrivals", MAX_ARRIVALS))
        ),
    )
