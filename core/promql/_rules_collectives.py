"""The recording rules of group mfuscope.job for collectives: bytes, bus bandwidth and its
efficiency, message size, overlap, and the latest of those figures held between profiled
windows."""

from __future__ import annotations

from mfuscope.core.promql import names as n
from mfuscope.core.promql import quantities as q
from mfuscope.core.promql.rules_file import Rule, Section
from mfuscope.core.promql.syntax import total

__all__ = ["collective_rules", "held_latest"]

OP_AXIS_TIER = ("job", "op", "axis", "tier")
AXIS_TIER = ("job", "axis", "tier")


def held_latest(record: str) -> str:
    """The latest value of `record` within the last hour, only while a collector holds live ranks
    of the job (it drops a job with its last rank), so a finished job's figure does not outlive
    it."""
    return f"last_over_time({record}[1h]) and on (job) mfuscope_ranks"


def collective_rules() -> list[Rule | Section]:
    return [
        Section(
            "collectives (nccl-tests definitions, docs/definitions.md#bus-bandwidth)",
            "busbw = bus bytes / collective time, where bus bytes = S × the nccl-tests bus "
            "factor, aggregated one way everywhere (docs/definitions.md#aggregating-busbw): the "
            "summed bus bytes over the summed seconds of the calls whose size is known "
            "(sized_bus_bytes / sized_seconds), across ranks, ops and time, which is the "
            "time-weighted mean busbw of those calls. Calls of unknown size add time but no bytes, "
            "so dividing by all collective time would understate busbw; bus_bytes counts every "
            "call from the always-on records, while without recorder durations (gloo, NCCL timing "
            "off) the times come from profiled windows (docs/definitions.md#collective-records).",
        ),
        Rule(n.COLLECTIVE_BYTES_5M, total(q.RATE_5M.of(q.COLLECTIVE_BYTES), OP_AXIS_TIER)),
        Rule(n.BUSBW_5M, q.busbw(q.RATE_5M, OP_AXIS_TIER)),
        Rule(n.BUSBW_TIER_OP_5M, q.busbw(q.RATE_5M, ("job", "tier", "op"))),
        Rule(
            n.EFFICIENCY_5M,
            q.busbw_efficiency(n.BUSBW_5M),
            "Efficiency against the tier's spec (unidirectional link rate, "
            "docs/definitions.md#bandwidth-efficiency).",
        ),
        Rule(
            n.MEAN_MESSAGE_BYTES_5M,
            q.mean_message_bytes(q.RATE_5M, OP_AXIS_TIER),
            "Mean message size S per call: small messages are latency-bound and never reach the "
            "spec, so the busbw alert only considers large ones.",
        ),
        Rule(
            n.COLLECTIVE_OVERLAP_5M,
            q.collective_overlap(q.RATE_5M, AXIS_TIER),
            "Share of collective time hidden under compute, per axis and tier: both from profiled "
            "windows (collective seconds may come from the always-on records).",
        ),
        Section(
            "the latest figure of the collective series "
            "(docs/operations.md#profiled-windows-and-staleness)",
            "Collective time, and so busbw and overlap, may come from profiled windows only (3 "
            "steps every 5 to 30 min): the counters jump at a window and stay flat until the next, "
            "so the 5 min ratios above exist only in the 5 min after each window. These keep the "
            "latest 5 min ratio that had collectives, for up to 1 h: where the counters move at "
            "every scrape they equal the 5 min ratios; between windows they hold the latest "
            "window's figure, as old as mfuscope_breakdown_age_seconds says. Only while a "
            "collector holds live ranks of the job (it drops a job with its last rank), so a "
            "finished job's figure does not outlive it.",
        ),
        Rule(n.BUSBW_LATEST, held_latest(n.BUSBW_5M)),
        Rule(n.EFFICIENCY_LATEST, held_latest(n.EFFICIENCY_5M)),
        Rule(n.MEAN_MESSAGE_BYTES_LATEST, held_latest(n.MEAN_MESSAGE_BYTES_5M)),
        Rule(n.COLLECTIVE_OVERLAP_LATEST, held_latest(n.COLLECTIVE_OVERLAP_5M)),
    ]
