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

from typing import Annotated

from mfuscope.core._fields import Count, Label, Name, UnixNanos, choice, count, number
from mfuscope.core.errors import SchemaError
from mfuscope.core.vocabulary import COLLECTIVE_OPS, TIERS
from msgspec import Meta, Struct

__all__ = [
    "COMM_SOURCES",
    "PENDING_OPS",
    "ArrivalSample",
    "CollectiveTraffic",
    "CommRecords",
    "GroupProgress",
    "PendingCollective",
    "check_comm",
]

COMM_SOURCES: tuple[str, ...] = ("flight_recorder",)
# What a rank can be found waiting in: the data-moving ops, a barrier, or something else
# (a coalesced group of ops, an op mfuscope does not name).
PENDING_OPS: tuple[str, ...] = (*COLLECTIVE_OPS, "barrier", "other")

MAX_TRAFFIC_KEYS = 4_096
MAX_COMM_GROUPS = 256
MAX_ARRIVALS = 4_096
_MAX_SECONDS = 1e12
_MAX_WORLD = 1 << 20
# `sized_seconds` is a part of `seconds`, summed apart: allow float rounding.
_PART_REL_TOL = 1e-6
_PART_ABS_TOL = 1e-9

_Op = Annotated[str, choice(COLLECTIVE_OPS)]
_Tier = Annotated[str, choice(TIERS)]
_GroupSize = Annotated[int, count(1, _MAX_WORLD)]
_Seconds = Annotated[float, number(0.0, _MAX_SECONDS)]


# The records are frozen msgspec Structs: the wire definition itself (the agent encodes them, the
# collector decodes into them). ``kw_only``: a field the wire may leave out (it has a default) can
# come before one it may not. ``gc=False``: plain trees, never in a reference cycle.
class CollectiveTraffic(Struct, frozen=True, kw_only=True, gc=False):
    op: _Op
    axis: Name
    tier: _Tier
    group_size: _GroupSize | None = None  # None: the group is unknown, so no bus factor
    calls: Count
    bytes: Count
    seconds: _Seconds = 0.0
    sized_seconds: _Seconds = 0.0
    sized_bytes: Count = 0


class PendingCollective(Struct, frozen=True, kw_only=True, gc=False):
    seq: Count
    op: Annotated[str, choice(PENDING_OPS)]
    bytes: Count | None = None
    waited_s: _Seconds


class GroupProgress(Struct, frozen=True, kw_only=True, gc=False):
    group: Label
    axis: Name
    tier: _Tier
    size: _GroupSize | None = None
    entered_seq: Count
    completed_seq: Count  # at most `entered_seq`
    pending: PendingCollective | None = None  # its seq at most `entered_seq`


class ArrivalSample(Struct, frozen=True, gc=False):
    group: Label
    seq: Count
    enqueued_unix_ns: UnixNanos


class CommRecords(Struct, frozen=True, kw_only=True, gc=False):
    source: Annotated[str, choice(COMM_SOURCES)]
    durations: bool = False
    status_interval_s: Annotated[float, number(0.1, 3600.0)]
    lost_total: Count = 0
    p2p_recorded: bool = False
    traffic: Annotated[tuple[CollectiveTraffic, ...], Meta(max_length=MAX_TRAFFIC_KEYS)] = ()
    groups: Annotated[tuple[GroupProgress, ...], Meta(max_length=MAX_COMM_GROUPS)] = ()
    arrivals: Annotated[tuple[ArrivalSample, ...], Meta(max_length=MAX_ARRIVALS)] = ()


def check_comm(comm: CommRecords) -> None:
    """The rules of a decoded ``comm`` record that no single field states. Raises `SchemaError`
    naming the field."""
    for i, t in enumerate(comm.traffic):
        if t.sized_seconds > t.seconds * (1 + _PART_REL_TOL) + _PART_ABS_TOL:
            raise SchemaError(
                f"comm.traffic[{i}].sized_seconds",
                f"{t.sized_seconds!r} exceeds seconds {t.seconds!r}",
            )
    names = set()
    for i, g in enumerate(comm.groups):
        if g.completed_seq > g.entered_seq:
            raise SchemaError(
                f"comm.groups[{i}].completed_seq",
                f"{g.completed_seq} above entered_seq {g.entered_seq}",
            )
        if g.pending is not None and g.pending.seq > g.entered_seq:
            raise SchemaError(
                f"comm.groups[{i}].pending.seq",
                f"{g.pending.seq} above entered_seq {g.entered_seq}",
            )
        names.add(g.group)
    if len(names) != len(comm.groups):
        raise SchemaError("comm.groups", "a group appears twice")
