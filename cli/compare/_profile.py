"""One side of `mfuscope compare` as a `RunProfile`, from what the report or the collector computed.

Traces and agent output go through the report's aggregates (`cli.report.writer.build_content`,
every figure by its one definition in `core.run_summary`); a collector summary is read as the
collector computed it (`GET /v1/summary`, docs/collector.md), never recomputed here.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from mfuscope.cli.report.writer import ReportContent
from mfuscope.core.errors import ReportInputError
from mfuscope.core.run_summary.breakdowns import segment_label
from mfuscope.core.run_summary.collective_totals import collective_totals
from mfuscope.core.run_summary.comparison import CollectiveFigures, RunProfile
from mfuscope.core.stragglers import is_straggler
from mfuscope.core.vocabulary import COMPONENTS

__all__ = ["profile_of_content", "profile_of_summary"]


def _bucket_shares(content: ReportContent) -> tuple[tuple[str, float], ...]:
    """Each bucket's share of the measured step time over all ranks (a ratio of sums), exposed
    communication by axis and tier."""
    ranks = content.decomposition
    total = math.fsum(r.mean_step_s for r in ranks)
    if not ranks or not total > 0:
        return ()
    return tuple(
        (seg.label, math.fsum(r.segments[i].seconds for r in ranks) / total)
        for i, seg in enumerate(ranks[0].segments)
    )


def _kernel_classes(content: ReportContent) -> tuple[tuple[str, float], ...]:
    splits = content.kernel_classes
    if not splits:
        return ()
    names = [name for name, _ in splits[0].seconds]
    return tuple(
        (name, math.fsum(dict(s.seconds)[name] for s in splits) / len(splits)) for name in names
    )


def _kernel_families(content: ReportContent) -> tuple[tuple[str, float], ...]:
    """Each family's kernel seconds per step, averaged over the ranks that have families."""
    ranks = [r.kernel_families for r in content.run.ranks if r.kernel_families]
    if not ranks:
        return ()
    sums: dict[str, float] = {}
    for families in ranks:
        for family, seconds in families:
            sums[family] = sums.get(family, 0.0) + seconds
    return tuple(sorted(((f, s / len(ranks)) for f, s in sums.items()), key=lambda fs: -fs[1]))


def profile_of_content(content: ReportContent, kind: str) -> RunProfile:
    """The figures of a run loaded from traces or agent output."""
    run = content.run
    waterfall = content.waterfall
    mfu, hfu = content.overall if content.overall is not None else (None, None)
    collectives = tuple(
        CollectiveFigures(
            t.op,
            t.axis,
            t.tier,
            t.calls / t.rank_steps,
            t.bytes / t.rank_steps,
            t.busbw_bytes_per_s,
        )
        for t in collective_totals(run)
        if t.rank_steps
    )
    view = content.stragglers
    return RunProfile(
        kind=kind,
        source=run.source,
        job=run.job,
        world_size=run.world_size,
        ranks=len(run.ranks),
        steps=run.step_count,
        rank_steps=run.step_reports,
        windows=content.coverage.windows,
        measured_rank_steps=content.coverage.measured,
        devices=tuple(sorted({r.device for r in run.ranks})),
        peak_flops=tuple(sorted({r.peak_flops for r in run.ranks if r.peak_flops})),
        mean_step_s=content.mean_step_s or None,
        mfu=mfu,
        hfu=hfu,
        waterfall=tuple((s.label, s.fraction) for s in waterfall.slices) if waterfall else (),
        shares=_bucket_shares(content),
        kernel_classes=_kernel_classes(content),
        kernel_families=_kernel_families(content),
        collectives=collectives,
        stragglers=tuple((s.rank, s.ratio) for s in view.stragglers),
        named_stragglers=tuple(s.rank for s in view.named),
        run_key=next((r.run_key for r in run.ranks if r.run_key), ""),
        peak_sources=tuple(sorted({r.peak_source for r in run.ranks if r.peak_flops})),
        effective_mfu=run.job_time.effective_mfu,
    )


def _number(value: Any, what: str) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ReportInputError(f"collector summary: {what} is not a number: {value!r}")
    return float(value)


def _summary_slices(job: Mapping[str, Any]) -> tuple[tuple[str, float], ...]:
    components = job.get("components") or {}
    exposed = job.get("exposed_comm") or []
    out: list[tuple[str, float]] = []
    for component in COMPONENTS:
        if component == "exposed_comm" and exposed:
            out += [
                (
                    segment_label(component, e["axis"], e["tier"]),
                    _number(e["fraction"], "exposed_comm") or 0.0,
                )
                for e in exposed
            ]
        elif component in components:
            out.append((segment_label(component), _number(components[component], component) or 0.0))
    return tuple(out)


def profile_of_summary(document: Mapping[str, Any], job: str | None, source: str) -> RunProfile:
    """The figures of one job of a collector's ``/v1/summary`` document. MFU/HFU and the bucket
    shares are the collector's latest window; collectives its ranks' latest profiled steps
    (`calls` and `bytes` over the ranks: per rank-step once divided by them)."""
    jobs = document.get("jobs")
    if not isinstance(jobs, list) or not jobs:
        raise ReportInputError(f"{source}: the collector summary holds no job")
    names = [j.get("job") for j in jobs]
    if job is None:
        if len(jobs) > 1:
            raise ReportInputError(f"{source}: several jobs ({', '.join(map(str, names))}): --job")
        (chosen,) = jobs
    elif job in names:
        chosen = jobs[names.index(job)]
    else:
        raise ReportInputError(f"{source}: job {job!r} not in the summary ({', '.join(names)})")
    try:
        steps = int(chosen["steps_total"])
        seconds = _number(chosen["step_seconds_total"], "step_seconds_total") or 0.0
        ranks = int(chosen["ranks"])
        per_rank = max(ranks, 1)
        collectives = tuple(
            CollectiveFigures(
                c["op"],
                c["axis"],
                c["tier"],
                int(c["calls"]) / per_rank,
                (_number(c["bytes"], "bytes") or 0.0) / per_rank,
                _number(c.get("busbw_bytes_per_s"), "busbw_bytes_per_s"),
            )
            for c in chosen.get("collectives") or []
        )
        stragglers = tuple(
            (int(s["rank"]), _number(s["ratio"], "ratio") or 0.0)
            for s in chosen.get("stragglers") or []
        )
        health = chosen.get("agent_health") or {}
        return RunProfile(
            kind="collector summary",
            source=source,
            job=str(chosen["job"]),
            world_size=int(chosen["world_size"]),
            ranks=ranks,
            steps=steps // per_rank,
            rank_steps=steps,
            # Ranks profile the same steps: the agents' windows over the ranks is the job's.
            windows=int(health.get("windows_analysed_total", 0)) // per_rank,
            measured_rank_steps=None,
            devices=(),
            # The summary gives the live ranks' sum; per rank, assuming one kind of device.
            peak_flops=(peak / per_rank,)
            if (peak := _number(chosen.get("peak_flops"), "peak_flops"))
            else (),
            mean_step_s=seconds / steps if steps else None,
            mfu=_number(chosen.get("mfu"), "mfu"),
            hfu=_number(chosen.get("hfu"), "hfu"),
            waterfall=(),
            shares=_summary_slices(chosen),
            collectives=collectives,
            stragglers=tuple(sorted(stragglers, key=lambda s: -s[1])),
            named_stragglers=tuple(rank for rank, ratio in stragglers if is_straggler(ratio)),
            run_key=str(chosen.get("run_key") or ""),
            effective_mfu=_number(chosen.get("effective_mfu"), "effective_mfu"),
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise ReportInputError(f"{source}: not a collector summary ({exc!r})") from None
