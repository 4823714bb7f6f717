"""The rule group mfuscope.arrivals: arrival skew and lateness of groups whose ranks report to
several collectors (docs/fleet.md#arrival-skew-across-sidecars).

For such a group each collector exports every rank's held arrival sample: the sequence number of
one collective (``mfuscope_collective_arrival_seq``) and when the rank enqueued it
(``mfuscope_collective_arrival_enqueued_seconds``, Unix s), one per rank and group per period
(60 s by default), and the group's size (``mfuscope_collective_group_size``). A group's samples
are joined once every rank holds the same collective (the group's highest held seq, held by as
many ranks as the group has); then skew and lateness follow the collector's definitions
(docs/definitions.md#arrival-skew): skew = latest - earliest enqueue time, lateness = enqueue time
- the group's median. Groups whole on one collector keep the collector's own series, which these
rules pass through. One expression per rule from the collectors' series (no rule reads another:
vmalert would read its previous evaluation).
"""

from __future__ import annotations

from mfuscope.core.promql import names as n
from mfuscope.core.promql.rules_file import Group, Rule

__all__ = ["arrivals_group"]

_HELD = (
    "max by (job, rank, host, node, group, axis, tier) "
    "(mfuscope_collective_arrival_enqueued_seconds)"
)
_SEQ = "mfuscope_collective_arrival_seq"
_AT_LATEST = (
    f"{_HELD} and on (job, group, rank) (max by (job, group, rank) ({_SEQ}) == on (job, group) "
    f"group_left max by (job, group) ({_SEQ}))"
)
# The held samples of the groups whose every rank holds the same (latest) collective.
JOINED = (
    f"({_AT_LATEST} and on (job, group) (count by (job, group) ({_AT_LATEST}) >= on (job, group) "
    "max by (job, group) (mfuscope_collective_group_size)))"
)
ARRIVAL_SKEW = (
    f"max by (job, axis, tier) (max by (job, group, axis, tier) {JOINED} - min by (job, group, "
    f"axis, tier) {JOINED}) or max by (job, axis, tier) (mfuscope_collective_arrival_skew_seconds)"
)
ARRIVAL_LATENESS = (
    f"avg by (job, rank, host, node) ({JOINED} - on (job, group) group_left quantile by (job, "
    f"group) (0.5, {JOINED})) or max by (job, rank, host, node) "
    "(mfuscope_collective_arrival_lateness_seconds)"
)


def arrivals_group() -> Group:
    return Group(
        "mfuscope.arrivals",
        (
            Rule(
                n.ARRIVAL_SKEW_SECONDS,
                ARRIVAL_SKEW,
                "Arrival skew per axis and tier, s: the largest spread of enqueue times of one "
                "collective among the groups, from the held samples of groups across collectors "
                "(one collective per group and period), else the collectors' own smoothed skew. "
                "Across hosts it includes their clock offset.",
            ),
            Rule(
                n.ARRIVAL_LATENESS_SECONDS,
                ARRIVAL_LATENESS,
                "Each rank's lateness behind its groups' median enqueue time, s, averaged over "
                "its groups across collectors (negative: early), else the collectors' own "
                "smoothed lateness of their latest ranks.",
            ),
        ),
        comment=(
            "Arrival skew and lateness across collectors "
            "(docs/fleet.md#arrival-skew-across-sidecars): the same figures whether a group's "
            "ranks report to one collector or to one sidecar per node."
        ),
    )
