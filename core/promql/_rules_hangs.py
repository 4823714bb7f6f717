"""The rule group mfuscope.hangs: the hang join across collectors (docs/fleet.md, "Hangs").

Each collector knows only its own ranks. While ranks are blocked, it exports per process group the
collective they wait in (``mfuscope_collective_group_waiting_seq``, its sequence number as value
and as label); while a rank that is not blocked has an overdue step (a stalled rank), it exports
that rank's highest entered sequence number per group (``mfuscope_collective_group_entered_seq``).
A group's key is the c10d process-group name, which torch makes the same on every member rank. The
join is the one the collector makes over its own ranks (docs/definitions.md#hangs): a rank behind
the collective its group waits in, and blocked nowhere (a blocked rank exports no progress), never
joined it. One expression from the collectors' series, no rule reading another rule's series: on
vmalert a rule of the same group may read the previous evaluation's value of the rule above it.
"""

from __future__ import annotations

from mfuscope.core.promql import names as n
from mfuscope.core.promql.rules_file import Group, Rule

__all__ = ["hangs_group"]

_SUSPECT_LABELS = "job, rank, host, node, op, seq, axis, tier, reason"

# The collective each group waits in: the lowest waited-in sequence number (every blocked rank of
# a group waits in the same one; at a desync two ops share it and one is kept, the collector's own
# suspects say which).
_WAITED = (
    "bottomk by (job, group) (1, min by (job, group, op, seq) "
    "(mfuscope_collective_group_waiting_seq))"
)
_BEHIND = (
    "(max by (job, group, rank, host, node, axis, tier) (mfuscope_collective_group_entered_seq) "
    f"< on (job, group) group_left (op, seq) {_WAITED})"
)
_WAITED_S = "max by (job, group) (mfuscope_collective_group_waiting_seconds)"
_LOCAL = f"max by ({_SUSPECT_LABELS}) (mfuscope_collective_hang_suspect_seconds)"
_JOINED = (
    f"max by ({_SUSPECT_LABELS}) (label_replace({_BEHIND} * 0 + on (job, group) group_left "
    f'{_WAITED_S}, "reason", "not_joined", "", ""))'
)
# One series per rank: a rank a collector names itself keeps that collector's labels (so one
# collector gives exactly its own answer), and a rank several groups wait for is named under the
# longest wait, as the collector names it once.
HANG_SUSPECTS = f"topk by (job, rank) (1, {_LOCAL} or ({_JOINED} unless on (job, rank) {_LOCAL}))"


def hangs_group() -> Group:
    return Group(
        "mfuscope.hangs",
        (
            Rule(
                n.HANG_SUSPECT_SECONDS,
                HANG_SUSPECTS,
                "The ranks a blocked job waits for, in every layout: those the rule finds across "
                "collectors (reason not_joined), or those a collector found among its own ranks "
                "(not_joined, or desync: another op at that seq, or a cycle). Value: how long the "
                "longest-waiting rank has waited, s. Exists only while ranks wait.",
            ),
        ),
        comment=(
            "Hangs across collectors (docs/fleet.md#hangs-across-sidecars): the join of blocked "
            "ranks with the ranks they wait for happens here, so it holds whether a job's ranks "
            "report to one collector or to one sidecar per node."
        ),
    )
