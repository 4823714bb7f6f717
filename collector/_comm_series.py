"""The hang and arrival part of the metric contract (docs/reference/metrics.md).

From the agents' always-on collective records (docs/definitions.md#hangs and #arrival-skew):

- ``mfuscope_collective_blocked_ranks{job, axis, tier, op}``: live ranks waiting 10 s or more in a
  collective, each under its longest wait; ``mfuscope_collective_blocked_seconds`` the longest
  wait. Present only while some rank is blocked: the series clear when the job moves on.
- ``mfuscope_collective_hang_suspect_seconds{job, rank, host, node, op, seq, axis, tier, reason}``:
  the ranks the blocked ones wait for (``not_joined``: never entered collective ``seq``;
  ``desync``: entered another op at that ``seq``, or waits in a cycle), how long they have been
  waited for; at most the collector's ``max_hang_suspects`` per job, the most waited-on first.
  ``mfuscope_collective_hang_suspects{job}`` counts them all.
- ``mfuscope_collective_group_waiting_seq{job, group, seq, op, axis, tier}`` (value: ``seq``) and
  ``mfuscope_collective_group_waiting_seconds`` (the longest wait): this collector's blocked ranks
  per collective they wait in; ``mfuscope_collective_group_entered_seq{job, rank, host, node,
  group, axis, tier}``: the highest sequence number a rank that is not blocked entered, while its
  step is overdue or a rank of this collector is blocked. A rule joins them across collectors
  (docs/fleet.md#hangs-across-sidecars); present only while something waits or is overdue.
- ``mfuscope_collective_arrival_skew_seconds{job, axis, tier}``: smoothed spread of the ranks'
  enqueue times of one collective; ``mfuscope_collective_arrival_lateness_seconds{job, rank,
  host, node}``: the latest-arriving ranks' smoothed lateness behind their groups' median.
- ``mfuscope_collective_arrival_seq{job, rank, host, node, group, axis, tier}`` and
  ``mfuscope_collective_arrival_enqueued_seconds`` (same labels): each rank's held arrival sample
  of a group whose ranks report to several collectors (sequence number; enqueue time, Unix s),
  one per rank and group per ``--arrival-sample`` period; ``mfuscope_collective_group_size{job,
  group, axis, tier}`` the size of such groups. The rules join them into skew and lateness
  (docs/fleet.md#arrival-skew-across-sidecars).
- ``mfuscope_collective_records_lost_total{job}``: recorder entries overwritten before an agent
  read them (their calls are missing from the traffic counters).
"""

from __future__ import annotations

from collections.abc import Callable

from mfuscope.collector._snapshot import JobSnapshot
from mfuscope.exporters.model import MetricKind, Sample

__all__ = ["AddFamily", "comm_families"]

# (name, kind, unit, help, label names, samples): how the metric contract adds one family.
AddFamily = Callable[[str, MetricKind, str, str, tuple[str, ...], list[Sample]], None]


def comm_families(jobs: tuple[JobSnapshot, ...], add: AddFamily) -> None:
    """Add the hang and arrival families of `jobs`, in a fixed order."""
    op_labels = ("job", "axis", "tier", "op")
    add(
        "mfuscope_collective_blocked_ranks",
        "gauge",
        "{rank}",
        "live ranks waiting 10 s or more in a collective (each under its longest wait)",
        op_labels,
        [Sample((j.job, b.axis, b.tier, b.op), b.ranks) for j in jobs for b in j.hangs.blocked],
    )
    add(
        "mfuscope_collective_blocked_seconds",
        "gauge",
        "s",
        "longest wait of a blocked rank in a collective, seconds",
        op_labels,
        [Sample((j.job, b.axis, b.tier, b.op), b.waited_s) for j in jobs for b in j.hangs.blocked],
    )
    add(
        "mfuscope_collective_hang_suspect_seconds",
        "gauge",
        "s",
        "a rank the blocked ranks wait for (reason not_joined: it never entered collective "
        "seq; desync: it entered another op there, or waits in a cycle), and how long the "
        "longest of them has waited, seconds",
        ("job", "rank", "host", "node", "op", "seq", "axis", "tier", "reason"),
        [
            Sample(
                (
                    j.job,
                    str(s.rank),
                    s.host,
                    s.node,
                    s.op,
                    str(s.seq),
                    s.axis,
                    s.tier,
                    s.reason,
                ),
                s.waited_s,
            )
            for j in jobs
            for s in j.hangs.suspects
        ],
    )
    add(
        "mfuscope_collective_hang_suspects",
        "gauge",
        "{rank}",
        "ranks the blocked ranks wait for (all of them; the suspect series lists the first)",
        ("job",),
        [Sample((j.job,), j.hangs.suspects_total) for j in jobs if j.hangs.blocked],
    )
    wait_labels = ("job", "group", "seq", "op", "axis", "tier")
    add(
        "mfuscope_collective_group_waiting_seq",
        "gauge",
        "1",
        "sequence number of the collective this collector's blocked ranks wait in, per process "
        "group (the rules join it with the entered sequence numbers of every collector's ranks)",
        wait_labels,
        [
            Sample((j.job, w.group, str(w.seq), w.op, w.axis, w.tier), float(w.seq))
            for j in jobs
            for w in j.progress.waits
        ],
    )
    add(
        "mfuscope_collective_group_waiting_seconds",
        "gauge",
        "s",
        "longest wait of this collector's blocked ranks in that collective, seconds",
        wait_labels,
        [
            Sample((j.job, w.group, str(w.seq), w.op, w.axis, w.tier), w.waited_s)
            for j in jobs
            for w in j.progress.waits
        ],
    )
    add(
        "mfuscope_collective_group_entered_seq",
        "gauge",
        "1",
        "highest collective sequence number a rank that is not blocked entered in a process "
        "group, while its step is overdue or a rank of this collector is blocked",
        ("job", "rank", "host", "node", "group", "axis", "tier"),
        [
            Sample((j.job, str(p.rank), p.host, p.node, p.group, p.axis, p.tier), p.entered_seq)
            for j in jobs
            for p in j.progress.progress
        ],
    )
    add(
        "mfuscope_collective_arrival_skew_seconds",
        "gauge",
        "s",
        "smoothed spread of the ranks' enqueue times of one collective, seconds (across hosts "
        "it includes their clock offset)",
        ("job", "axis", "tier"),
        [Sample((j.job, a, t), v) for j in jobs for a, t, v in j.arrival_skew],
    )
    add(
        "mfuscope_collective_arrival_lateness_seconds",
        "gauge",
        "s",
        "smoothed time the latest-arriving ranks enter collectives after their groups' "
        "median, seconds",
        ("job", "rank", "host", "node"),
        [
            Sample((j.job, str(rank), host, node), late)
            for j in jobs
            for rank, host, node, late in j.late_arrivals
        ],
    )
    held_labels = ("job", "rank", "host", "node", "group", "axis", "tier")
    add(
        "mfuscope_collective_arrival_seq",
        "gauge",
        "1",
        "sequence number of the collective of the rank's held arrival sample, for groups whose "
        "ranks report to several collectors",
        held_labels,
        [
            Sample((j.job, str(r), host, node, g, a, t), float(seq))
            for j in jobs
            for r, host, node, g, a, t, seq, _ in j.arrival_held
        ],
    )
    add(
        "mfuscope_collective_arrival_enqueued_seconds",
        "gauge",
        "s",
        "when the rank enqueued that collective, by its host's wall clock, seconds since the epoch",
        held_labels,
        [
            Sample((j.job, str(r), host, node, g, a, t), enqueued)
            for j in jobs
            for r, host, node, g, a, t, _, enqueued in j.arrival_held
        ],
    )
    add(
        "mfuscope_collective_group_size",
        "gauge",
        "{rank}",
        "ranks in a process group whose ranks report to several collectors",
        ("job", "group", "axis", "tier"),
        [Sample((j.job, g, a, t), float(n)) for j in jobs for g, a, t, n in j.arrival_groups],
    )
    add(
        "mfuscope_collective_records_lost_total",
        "counter",
        "{record}",
        "flight-recorder entries overwritten before an agent read them (missing from the "
        "collective counters)",
        ("job",),
        [Sample((j.job,), float(j.records_lost), j.start_unix_ns) for j in jobs],
    )
