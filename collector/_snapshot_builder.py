"""Build a `CollectorSnapshot` from the aggregation state, never walking reports.

Job-level figures come from each job's `CountedSums` (O(keys)); only ages, world size and the
straggler medians need one cheap pass over the live ranks. Read-only over the state; the caller
holds the state's lock and runs `expire` first.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Literal

from mfuscope.collector._accumulators import CollectiveAcc, SeriesAcc
from mfuscope.collector._rank import RankState
from mfuscope.collector._snapshot import (
    CollectiveTotals,
    CollectiveWindow,
    CollectorSnapshot,
    ComponentTotals,
    HistogramTotals,
    JobSnapshot,
    LatestWindow,
    RankView,
    SeriesTotals,
    Straggler,
    TierPeak,
)
from mfuscope.collector._state import AggregationState, JobState, StateConfig
from mfuscope.collector._sums import Key, Kind
from mfuscope.core.bandwidth import aggregate_busbw_bytes_per_s, busbw_efficiency
from mfuscope.core.hangs import RankComm, find_hangs, progress_export, step_overdue
from mfuscope.core.mfu import utilization
from mfuscope.core.schema import AgentHealth
from mfuscope.core.stragglers import find_stragglers, straggler_step_times

__all__ = ["build_snapshot"]

_Sums = Mapping[Key, tuple[float, ...]]


def build_snapshot(state: AggregationState, now_s: float) -> CollectorSnapshot:
    """The snapshot of `state` at monotonic time `now_s` (for ages)."""
    return CollectorSnapshot(
        jobs=tuple(_job(state.jobs[name], state.config, now_s) for name in sorted(state.jobs)),
        rejected=tuple(sorted(state.rejected.items())),
        per_rank_labels=state.config.per_rank_labels,
        expire_after_s=state.config.expire_after_s,
    )


def _collective_totals(key: tuple[str, str, str], acc: CollectiveAcc) -> CollectiveTotals:
    op, axis, tier = key
    return CollectiveTotals(
        op=op,
        axis=axis,
        tier=tier,
        calls=acc.calls,
        bytes=acc.bytes,
        bus_bytes=acc.bus_bytes,
        seconds=acc.seconds,
        overlapped_seconds=acc.overlapped,
        sized_seconds=acc.sized_seconds,
        sized_bus_bytes=acc.sized_bus_bytes,
        profiled_seconds=acc.profiled_seconds,
    )


def _series(rank: int | None, acc: SeriesAcc) -> SeriesTotals:
    h = acc.histogram
    observed = h.min <= h.max  # False until the first observation
    return SeriesTotals(
        rank=rank,
        start_unix_ns=acc.start_unix_ns,
        steps=acc.steps,
        step_seconds=acc.step_seconds,
        model_flops=acc.model_flops,
        hardware_flops=acc.hardware_flops,
        overlapped_comm_seconds=acc.overlapped,
        duplicates=acc.duplicates,
        reruns=acc.reruns,
        peak_flop_seconds=acc.peak_flop_seconds,
        components=tuple(
            ComponentTotals(component=k[0], axis=k[1], tier=k[2], seconds=v)
            for k, v in sorted(acc.components.items())
        ),
        collectives=tuple(_collective_totals(k, v) for k, v in sorted(acc.collectives.items())),
        step_duration=HistogramTotals(
            bucket_counts=tuple(h.counts),
            sum=h.sum,
            min=h.min if observed else 0.0,
            max=h.max if observed else 0.0,
        ),
        compute_classes=tuple(sorted(acc.compute_classes.items())),
        time_seconds=tuple(ns / 1e9 for ns in acc.time_ns),
        time_peak_flop_seconds=acc.time_peak_flop_seconds,
        useful_model_flops=acc.useful_model_flops,
    )


def _by_kind(sums: _Sums, kind: str) -> list[tuple[tuple[str, ...], tuple[float, ...]]]:
    """The items of one kind, keyed by the rest of their key as text (see `RankState.refresh`)."""
    return sorted(
        (tuple(str(part) for part in key[1:]), values)
        for key, values in sums.items()
        if key[0] == kind
    )


def _latest(sums: _Sums, peaks: dict[tuple[str, str], float], config: StateConfig) -> LatestWindow:
    def busbw(acc: CollectiveAcc) -> float | None:
        # A profiled window's samples count bus bytes only for calls of known size and group
        # size, and exactly those calls' seconds in `sized_seconds`: the one busbw aggregation.
        return aggregate_busbw_bytes_per_s(acc.bus_bytes, acc.sized_seconds)

    def efficiency(bw: float | None, axis: str, tier: str) -> float | None:
        return busbw_efficiency(bw, peaks.get((axis, tier)))

    collectives = []
    for (op, axis, tier), values in _by_kind(sums, Kind.OP):
        acc = CollectiveAcc.from_sums(values)
        bw = busbw(acc)
        collectives.append(
            CollectiveWindow(
                op=op,
                axis=axis,
                tier=tier,
                calls=acc.calls,
                bytes=acc.bytes,
                seconds=acc.seconds,
                busbw_bytes_per_s=bw,
                efficiency=efficiency(bw, axis, tier),
            )
        )
    tier_busbw = []
    for (axis, tier), values in _by_kind(sums, Kind.TIER):
        bw = busbw(CollectiveAcc.from_sums(values))
        if bw is not None:
            tier_busbw.append((axis, tier, bw, efficiency(bw, axis, tier)))

    components = _by_kind(sums, Kind.COMPONENT)
    total = sum(values[0] for _, values in components)
    fractions = (
        tuple((c, a, t, values[0] / total) for (c, a, t), values in components) if total > 0 else ()
    )
    # Sum over ranks of each rank's FLOP/s over its window, over the sum of those ranks' peaks.
    model_rate, hardware_rate, peak = sums.get((Kind.RATES,), (0.0, 0.0, 0.0))
    return LatestWindow(
        window_steps=config.window_steps,
        mfu=utilization(model_rate, peak),
        hfu=utilization(hardware_rate, peak),
        component_fractions=fractions,
        collectives=tuple(collectives),
        tier_busbw=tuple(tier_busbw),
    )


def _stragglers(
    ranks: list[RankState], top: int
) -> tuple[tuple[Straggler, ...], Literal["self", "wall"]]:
    """Each rank's median step time over its window: own time when every rank has it."""
    walls = {r.rank: r.median_wall_s for r in ranks if r.median_wall_s is not None}
    times, basis = straggler_step_times(walls, {r.rank: r.median_self_s for r in ranks})
    return find_stragglers(times, top=top), basis


def _job(job: JobState, config: StateConfig, now_s: float) -> JobSnapshot:
    sums = job.sums.sums
    ranks = list(job.ranks.values())
    peaks: dict[tuple[str, str], float] = {}
    spec_sources: set[tuple[str, str, str]] = set()
    world_size = 1
    for kind, *labels in sums:
        if kind == Kind.TIER_PEAK:
            axis, tier, value = str(labels[0]), str(labels[1]), float(labels[2])
            peaks[(axis, tier)] = max(peaks.get((axis, tier), 0.0), value)
        elif kind == Kind.TIER_SPEC_SOURCE:
            spec_sources.add((str(labels[0]), str(labels[1]), str(labels[2])))
        elif kind == Kind.WORLD_SIZE:
            world_size = max(world_size, int(labels[0]))
    stragglers, basis = _stragglers(ranks, config.straggler_top)
    windows_seen = [r.window_seen_s for r in ranks if r.window_seen_s is not None]
    spreads = [s for s in (r.exposed_spread() for r in ranks) if s is not None]
    views: tuple[RankView, ...] = ()
    if config.per_rank_labels:
        views = tuple(
            RankView(
                rank=r.rank,
                peak_flops=r.peak_flops,
                last_report_age_s=max(now_s - r.last_seen_s, 0.0),
                health=AgentHealth(*job.health.counts(r.rank)),
                health_start_unix_ns=job.health.start_unix_ns(r.rank),
                closed=r.closed,
            )
            for r in sorted(ranks, key=lambda r: r.rank)
        )
    running = [r for r in ranks if not r.closed] or ranks
    comm = [
        RankComm(
            rank=r.rank,
            host=r.host,
            node=r.node,
            groups=r.comm_groups,
            age_s=max(now_s - r.comm_received_s, 0.0),
            interval_s=r.comm_interval_s,
            closed=r.closed,
            overdue=step_overdue(r.since_step_s(now_s), r.median_wall_s),
        )
        for r in ranks
        if r.comm_groups
    ]
    return JobSnapshot(
        job=job.name,
        live_ranks=len(ranks),
        world_size=world_size,
        peak_flops=sums.get((Kind.PEAK,), (0.0,))[0],
        peak_unknown_ranks=job.sums.counts.get((Kind.PEAK_UNKNOWN,), 0),
        last_report_age_s=max(now_s - min(r.last_seen_s for r in running), 0.0),
        all_closed=all(r.closed for r in ranks),
        tp_spans_hosts=(Kind.TP_SPANS_HOSTS,) in sums,
        # One key per job: the lowest live rank's (ranks of one workload send the same one).
        run_key=next((r.run_key for r in sorted(ranks, key=lambda r: r.rank) if r.run_key), ""),
        health=AgentHealth(*job.health.total),
        tier_peaks=tuple(TierPeak(a, t, v) for (a, t), v in sorted(peaks.items())),
        tier_spec_sources=tuple(sorted(spec_sources)),
        totals=tuple(
            _series(key, job.series[key])
            for key in sorted(job.series, key=lambda k: -1 if k is None else k)
        ),
        ranks=views,
        latest=_latest(sums, peaks, config),
        stragglers=stragglers,
        straggler_basis=basis,
        straggler_hosts=tuple(job.ranks[s.rank].host for s in stragglers),
        straggler_nodes=tuple(job.ranks[s.rank].node for s in stragglers),
        start_unix_ns=job.start_unix_ns,
        restarts=job.incarnations.restarts,
        hardware=job.hardware.view(job.ranks, per_rank=config.per_rank_labels),
        breakdown_age_s=max(now_s - max(windows_seen), 0.0) if windows_seen else None,
        breakdown_spread=max(spreads) if spreads else None,
        hangs=find_hangs(comm, max_suspects=config.max_hang_suspects),
        progress=progress_export(comm),
        arrival_skew=tuple((a, t, v) for (a, t), v in sorted(job.arrivals.skew.items())),
        late_arrivals=_late_arrivals(job, config.straggler_top),
        arrival_held=tuple(
            (rank, job.ranks[rank].host, job.ranks[rank].node, group, axis, tier, seq, ns / 1e9)
            for rank, group, axis, tier, seq, ns in job.arrivals.held()
            if rank in job.ranks
        ),
        arrival_groups=tuple(job.arrivals.spanning()),
        records_lost=job.records_lost.total[0],
    )


def _late_arrivals(job: JobState, top: int) -> tuple[tuple[int, str, str, float], ...]:
    """The `top` live ranks that arrive latest at collectives, latest first (lateness > 0)."""
    late = sorted(
        (
            (-lateness, rank)
            for rank, lateness in job.arrivals.lateness.items()
            if lateness > 0 and rank in job.ranks
        ),
    )[:top]
    return tuple(
        (rank, job.ranks[rank].host, job.ranks[rank].node, -negative) for negative, rank in late
    )
