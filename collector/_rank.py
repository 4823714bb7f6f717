"""What the collector keeps about one live rank.

Per rank: identity, its last `window_steps` steps, and its *contribution* to its job's
`CountedSums` (FLOP rates and peak, latest breakdown seconds, latest profiled collectives,
topology facts), recomputed by `refresh` once per batch so a scrape reads job-level sums instead
of redoing every rank's arithmetic. Agent-health counters live in the job's `HealthLedger`: they
must outlive the rank.

Only plain tuples of numbers and strings are kept, never the parsed report objects: at thousands
of ranks, every retained container object lengthens the garbage collector's full passes, which
stall ingest (a stall is a latency spike for every agent sending at that moment).
"""

from __future__ import annotations

import math
import sys
from collections import deque

from mfuscope.collector._accumulators import CollectiveAcc
from mfuscope.collector._incarnations import RankIncarnations
from mfuscope.collector._sums import Contribution, Key, Kind
from mfuscope.core.collective_records import GroupProgress
from mfuscope.core.run_summary.window_spread import (
    SPREAD_WINDOWS,
    exposed_parts,
    exposed_spread,
    window_exposed_share,
)
from mfuscope.core.schema import ComponentShare, ReportBatch, StepReport
from mfuscope.core.stragglers import own_time_s, recent_step_times
from mfuscope.core.vocabulary import component_axis

__all__ = ["RankState"]

_Items = tuple[tuple[Key, tuple[float, ...]], ...]


def _name(text: str) -> str:
    # Label values repeat across thousands of ranks; JSON decoding makes a fresh copy of each.
    return sys.intern(text)


class RankState:
    """One live rank (mutable; owned by the aggregation state)."""

    __slots__ = (
        "breakdown_items",
        "breakdown_step",
        "breakdown_taken",
        "closed",
        "collective_items",
        "collectives_step",
        "comm_groups",
        "comm_interval_s",
        "comm_received_s",
        "contribution",
        "first_seen_s",
        "host",
        "incarnations",
        "job",
        "last_seen_s",
        "median_self_s",
        "median_wall_s",
        "node",
        "peak_flops",
        "rank",
        "recent",
        "run_key",
        "step_seen_s",
        "topology_items",
        "window_seen_s",
        "windows",
        "world_size",
    )

    def __init__(self, job: str, rank: int, *, window_steps: int, idempotency_steps: int) -> None:
        self.job = job
        self.rank = rank
        self.world_size = 1
        self.host = ""
        self.node = ""
        self.peak_flops: float | None = None
        self.run_key = ""  # which runs are the same workload (docs/compare.md); "": not sent yet
        self.incarnations = RankIncarnations(idempotency_steps)
        self.last_seen_s = 0.0
        self.first_seen_s: float | None = None  # when its first batch arrived (monotonic s)
        # (wall_s, self_s or None, model_flops, hardware_flops) of the latest steps.
        self.recent: deque[tuple[float, float | None, float, float]] = deque(maxlen=window_steps)
        self.breakdown_items: _Items = ()
        self.breakdown_step = -1
        # The latest report's components, until `refresh` turns them into `breakdown_items`: of a
        # batch's reports only the latest breakdown counts, so it is built once per batch.
        self.breakdown_taken: tuple[ComponentShare, ...] | None = None
        self.collective_items: _Items = ()
        self.collectives_step = -1
        # When (monotonic s) the latest report of a profiled step arrived; None before any.
        self.window_seen_s: float | None = None
        # The latest profiled windows: (last step, the `exposed_parts` of each of its steps),
        # for the spread between windows (core.run_summary.coverage).
        self.windows: deque[tuple[int, tuple[tuple[float, float], ...]]] = deque(
            maxlen=SPREAD_WINDOWS
        )
        self.topology_items: _Items = ()
        # The rank's latest progress per process group (flight-recorder records), when it came
        # (monotonic s) and how often the rank reports while blocked; whether its agent closed.
        self.comm_groups: tuple[GroupProgress, ...] = ()
        self.comm_received_s = 0.0
        self.comm_interval_s = 10.0
        self.closed = False
        # When (monotonic s) the latest new step report arrived; None before any (a rank whose
        # step is overdue exports its progress, docs/definitions.md#hangs).
        self.step_seen_s: float | None = None
        # Derived by `refresh`: median step times over the window (s) and the contribution.
        self.median_wall_s: float | None = None
        self.median_self_s: float | None = None
        self.contribution: Contribution = ()

    def update_metadata(self, batch: ReportBatch, now_s: float) -> None:
        """Take the batch's rank-level facts (the latest batch wins)."""
        self.world_size = batch.world_size
        self.host = _name(batch.host)
        # The node label (docs/definitions.md#node-identity); an agent that sends none names
        # its host, as before node identities.
        self.node = _name(batch.node or batch.host)
        self.peak_flops = batch.peak_flops
        self.closed = batch.closing
        if batch.run_key:  # an agent sends it once the rank's FLOPs per step are known
            self.run_key = _name(batch.run_key)
        if batch.comm is not None:
            self.comm_groups = batch.comm.groups
            self.comm_received_s = now_s
            self.comm_interval_s = batch.comm.status_interval_s
        if self.first_seen_s is None:
            self.first_seen_s = now_s
        if batch.topology is not None:
            items: list[tuple[Key, tuple[float, ...]]] = []
            if batch.topology.tp_spans_hosts:
                items.append(((Kind.TP_SPANS_HOSTS,), (1.0,)))
            for g in batch.topology.groups:
                if g.link_peak_bytes_per_s is not None:
                    key = (Kind.TIER_PEAK, _name(g.axis), _name(g.tier), g.link_peak_bytes_per_s)
                    items.append((key, (1.0,)))
                if g.link_peak_source is not None:
                    source_key = (
                        Kind.TIER_SPEC_SOURCE,
                        _name(g.axis),
                        _name(g.tier),
                        g.link_peak_source,
                    )
                    items.append((source_key, (1.0,)))
            self.topology_items = tuple(items)
        self.last_seen_s = now_s

    def since_step_s(self, now_s: float) -> float | None:
        """Seconds since its latest new step report arrived, or since its first batch while it
        has reported no step (a rank stuck before its first step is overdue too); None before
        any batch."""
        since = self.step_seen_s if self.step_seen_s is not None else self.first_seen_s
        return None if since is None else max(now_s - since, 0.0)

    def add(self, r: StepReport, now_s: float) -> None:
        """Take one new (not duplicate) step report into the window, received at `now_s`."""
        self_s = own_time_s(r)
        self.step_seen_s = now_s
        if r.collectives or (r.components and r.breakdown_step == r.step):
            # A profiled step: only those carry collectives, and each carries its own breakdown
            # (later steps carry the window's, with an earlier "breakdown_step": schema).
            self.window_seen_s = now_s
            if r.components:
                self._add_window_step(r)
        if r.components and r.step >= self.breakdown_step:
            self.breakdown_step = r.step
            self.breakdown_taken = r.components
        if r.collectives and r.step >= self.collectives_step:
            self.collectives_step = r.step
            per_op: dict[tuple[str, str, str], CollectiveAcc] = {}
            per_tier: dict[tuple[str, str], CollectiveAcc] = {}
            for sample in r.collectives:
                axis, tier = _name(sample.axis), _name(sample.tier)
                per_op.setdefault((_name(sample.op), axis, tier), CollectiveAcc()).add(sample)
                per_tier.setdefault((axis, tier), CollectiveAcc()).add(sample)
            self.collective_items = tuple(
                [((Kind.OP, *k), acc.terms()) for k, acc in per_op.items()]
                + [((Kind.TIER, *k), acc.terms()) for k, acc in per_tier.items()]
            )
        self.recent.append((r.wall_s, self_s, r.model_flops, r.hardware_flops))

    def _add_window_step(self, r: StepReport) -> None:
        windows = self.windows
        if windows and windows[-1][0] + 1 == r.step:
            _, parts = windows.pop()
            windows.append((r.step, (*parts, exposed_parts(r))))
        else:
            windows.append((r.step, (exposed_parts(r),)))

    def exposed_spread(self) -> float | None:
        """The spread between this rank's latest windows (core.run_summary.coverage)."""
        shares = [window_exposed_share(parts) for _, parts in self.windows]
        return exposed_spread([s for s in shares if s is not None])

    def refresh(self) -> None:
        """Recompute the medians and the contribution; call once per batch, after `add`s."""
        recent = self.recent
        if self.breakdown_taken is not None:
            self.breakdown_items = tuple(
                (
                    (
                        Kind.COMPONENT,
                        _name(c.component),
                        _name(component_axis(c.component, c.axis)),
                        _name(c.tier),
                    ),
                    (c.seconds,),
                )
                for c in self.breakdown_taken
            )
            self.breakdown_taken = None
        items: list[tuple[Key, tuple[float, ...]]] = []
        if self.peak_flops is None:
            items.append(((Kind.PEAK_UNKNOWN,), (1.0,)))
        else:
            items.append(((Kind.PEAK,), (self.peak_flops,)))
        if recent:
            # The straggler times, by the one definition the report uses too.
            self.median_wall_s, self.median_self_s = recent_step_times((e[0], e[1]) for e in recent)
            if self.peak_flops is not None:
                wall = math.fsum(e[0] for e in recent)
                model_rate = math.fsum(e[2] for e in recent) / wall
                hardware_rate = math.fsum(e[3] for e in recent) / wall
                items.append(((Kind.RATES,), (model_rate, hardware_rate, self.peak_flops)))
        items.append(((Kind.WORLD_SIZE, self.world_size), (1.0,)))
        self.contribution = _merge_duplicate_keys(
            (*items, *self.topology_items, *self.breakdown_items, *self.collective_items)
        )


def _merge_duplicate_keys(items: Contribution) -> Contribution:
    """One item per key (a breakdown may list a component twice, a topology a tier twice)."""
    keys = [k for k, _ in items]
    if len(set(keys)) == len(keys):
        return items
    merged: dict[Key, tuple[float, ...]] = {}
    for key, values in items:
        old = merged.get(key)
        merged[key] = (
            values if old is None else tuple(a + b for a, b in zip(old, values, strict=True))
        )
    return tuple(merged.items())
