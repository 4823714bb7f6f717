"""``GET /v1/summary``: a JSON digest per job for live terminal views (format in docs/collector.md).

A pure function of a snapshot. Base units (s, bytes, bytes/s, FLOP/s); fractions and ratios 0..1.
"""

from __future__ import annotations

from typing import Any

import msgspec
from mfuscope.collector._series import REJECT_REASONS
from mfuscope.collector._snapshot import CollectorSnapshot, JobSnapshot
from mfuscope.core.ledger import CATEGORIES, effective_mfu

__all__ = ["SUMMARY_VERSION", "summary"]

SUMMARY_VERSION = 1
TOP_COLLECTIVES = 5


def _job(j: JobSnapshot, top_collectives: int) -> dict[str, Any]:
    totals = j.totals
    components: dict[str, float] = {}
    exposed = []
    for component, axis, tier, fraction in j.latest.component_fractions:
        components[component] = components.get(component, 0.0) + fraction
        if component == "exposed_comm":
            exposed.append({"axis": axis, "tier": tier, "fraction": fraction})
    collectives = sorted(j.latest.collectives, key=lambda c: (-c.seconds, c.op, c.axis, c.tier))
    peaks = {(p.axis, p.tier): p.bytes_per_s for p in j.tier_peaks}
    return {
        "job": j.job,
        "ranks": j.live_ranks,
        "world_size": j.world_size,
        "run_key": j.run_key,
        "steps_total": sum(t.steps for t in totals),
        "step_seconds_total": sum(t.step_seconds for t in totals),
        "window_steps": j.latest.window_steps,
        "mfu": j.latest.mfu,
        "hfu": j.latest.hfu,
        "effective_mfu": effective_mfu(
            sum(t.useful_model_flops for t in totals),
            sum(t.time_peak_flop_seconds for t in totals),
        ),
        "job_time_s": {
            category: sum(t.time_seconds[i] for t in totals if t.time_seconds)
            for i, category in enumerate(CATEGORIES)
        },
        "peak_flops": j.peak_flops,
        "peak_unknown_ranks": j.peak_unknown_ranks,
        "components": components,
        "exposed_comm": exposed,
        "collectives": [
            {
                "op": c.op,
                "axis": c.axis,
                "tier": c.tier,
                "calls": c.calls,
                "bytes": c.bytes,
                "seconds": c.seconds,
                "busbw_bytes_per_s": c.busbw_bytes_per_s,
                "efficiency": c.efficiency,
            }
            for c in collectives[:top_collectives]
        ],
        "tiers": [
            {
                "axis": axis,
                "tier": tier,
                "busbw_bytes_per_s": busbw,
                "peak_bytes_per_s": peaks.get((axis, tier)),
                "peak_sources": sorted(
                    src for a, t, src in j.tier_spec_sources if (a, t) == (axis, tier)
                ),
                "efficiency": efficiency,
            }
            for axis, tier, busbw, efficiency in j.latest.tier_busbw
        ],
        "stragglers": [
            {"rank": s.rank, "host": host, "node": node, "ratio": s.ratio, "step_s": s.step_s}
            for s, host, node in zip(
                j.stragglers, j.straggler_hosts, j.straggler_nodes, strict=True
            )
        ],
        "straggler_basis": j.straggler_basis,
        "tp_spans_hosts": j.tp_spans_hosts,
        "last_report_age_s": j.last_report_age_s,
        "reports": {
            "accepted": sum(t.steps for t in totals),
            "duplicates": sum(t.duplicates for t in totals),
            "reruns": sum(t.reruns for t in totals),
            "dropped_by_agents": j.health.reports_dropped_total,
        },
        "restarts": j.restarts,
        "agent_health": msgspec.structs.asdict(j.health),
    }


def summary(
    snapshot: CollectorSnapshot, *, top_collectives: int = TOP_COLLECTIVES
) -> dict[str, Any]:
    """The ``/v1/summary`` document for `snapshot` (JSON-serialisable, jobs sorted by name)."""
    rejected = dict.fromkeys(REJECT_REASONS, 0) | dict(snapshot.rejected)
    return {
        "version": SUMMARY_VERSION,
        "per_rank_labels": snapshot.per_rank_labels,
        "expire_after_s": snapshot.expire_after_s,
        "rejected": rejected,
        "jobs": [_job(j, top_collectives) for j in snapshot.jobs],
    }
