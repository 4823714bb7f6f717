"""The collector's aggregation state: counters per job (or per rank), and a little per rank.

Pure in the house sense: no clock reads, no I/O, no logging; the caller passes the time in
(`now_s` from a monotonic clock for ages and expiry, `now_unix_ns` from the wall clock for series
start times). Not thread-safe: the caller holds one lock around `apply`, `expire`, `snapshot`.

Memory is bounded by live ranks, not by reports: per rank a 512-byte idempotency window for each
of the job's few latest incarnations (launches; see `_incarnations`), the last
`window_steps` step times, and its latest breakdown and profiled collectives; per job (or rank,
with per-rank labels) one set of counters, and per rank seen while the job lives a few integers of
agent health. Ranks silent for longer than `expire_after_s` are dropped, and a job with no live
rank is dropped whole, so its series disappear.

Every exported counter is non-decreasing while its series exists: the per-job counters accumulate
every accepted report until the job expires (a rank's expiry takes nothing out of them), and the
agents' cumulative health counters go through a `HealthLedger`, which keeps expired ranks'
counts and adds a restarted agent's new counts on top.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from dataclasses import dataclass

from mfuscope.collector._accumulators import ALL_PARTS, TIMES, WINDOW, SeriesAcc
from mfuscope.collector._arrivals import ArrivalJoin
from mfuscope.collector._errors import OverLimit
from mfuscope.collector._hardware import HardwareLedger
from mfuscope.collector._health import HealthLedger, health_counts
from mfuscope.collector._incarnations import JobIncarnations
from mfuscope.collector._rank import RankState
from mfuscope.collector._seen_steps import DEFAULT_WIDTH
from mfuscope.collector._sums import REBUILD_EVERY, CountedSums
from mfuscope.collector._traffic import TrafficLedger
from mfuscope.core.arrivals import ARRIVAL_SAMPLE_S
from mfuscope.core.ledger import ProcessTime, book_batch, wall_ns
from mfuscope.core.schema import ReportBatch

__all__ = ["AggregationState", "IngestResult", "StateConfig"]


@dataclass(frozen=True)
class StateConfig:
    """Aggregation settings. `window_steps`: steps per rank behind the latest-window MFU and the
    straggler times; `straggler_top`: how many slowest ranks to expose; `idempotency_steps`: how
    far below a rank's highest step a re-sent step is still recognised individually.

    Cardinality limits (each bounds the exported series; docs/collector.md): `max_jobs` live jobs,
    `max_ranks_per_job` live ranks in one job, `max_axes_per_job` distinct parallelism axes named
    by one job's batches (every other label is a closed set, so with the axes bounded a job's
    series are bounded too; with per-rank labels they also grow with its ranks); `max_hang_suspects`
    suspect ranks exported per job while it hangs (docs/definitions.md#hangs)."""

    per_rank_labels: bool = False
    expire_after_s: float = 300.0
    window_steps: int = 20
    straggler_top: int = 3
    idempotency_steps: int = DEFAULT_WIDTH
    max_jobs: int = 256
    max_ranks_per_job: int = 65_536
    max_axes_per_job: int = 16
    max_hang_suspects: int = 8
    # One held arrival sample per rank and cross-collector group per this many seconds
    # (docs/fleet.md#arrival-skew-across-sidecars).
    arrival_sample_s: float = ARRIVAL_SAMPLE_S

    def __post_init__(self) -> None:
        if not (self.expire_after_s > 0 and math.isfinite(self.expire_after_s)):
            raise ValueError(f"expire_after_s must be a positive number, got {self.expire_after_s}")
        if self.window_steps < 1:
            raise ValueError(f"window_steps must be >= 1, got {self.window_steps}")
        if self.straggler_top < 0:
            raise ValueError(f"straggler_top must be >= 0, got {self.straggler_top}")
        if self.idempotency_steps < 1:
            raise ValueError(f"idempotency_steps must be >= 1, got {self.idempotency_steps}")
        if not (self.arrival_sample_s > 0 and math.isfinite(self.arrival_sample_s)):
            raise ValueError(f"arrival_sample_s must be > 0, got {self.arrival_sample_s}")
        for name in ("max_jobs", "max_ranks_per_job", "max_axes_per_job", "max_hang_suspects"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")


@dataclass(frozen=True)
class IngestResult:
    """Reports counted (`accepted`), re-sent ones acknowledged but not counted (`duplicates`),
    and how many of the counted ones re-ran a step an earlier incarnation had reported
    (`reruns`, a part of `accepted`)."""

    accepted: int
    duplicates: int
    reruns: int = 0


class JobState:
    __slots__ = (
        "arrivals",
        "axes",
        "hardware",
        "health",
        "incarnations",
        "name",
        "processes",
        "ranks",
        "records_lost",
        "series",
        "start_unix_ns",
        "sums",
        "traffic",
    )

    def __init__(
        self, name: str, start_unix_ns: int, arrival_sample_s: float = ARRIVAL_SAMPLE_S
    ) -> None:
        self.name = name
        # When this job's counters started from zero (its first batch since it was last expired).
        self.start_unix_ns = start_unix_ns
        self.ranks: dict[int, RankState] = {}
        # Agent-health counters of every rank seen while the job lives (see `_health`).
        self.health = HealthLedger()
        # Hardware counters of every rank seen while the job lives (see `_hardware`).
        self.hardware = HardwareLedger()
        # The live ranks' latest figures summed per job (see `_sums`).
        self.sums = CountedSums()
        # Key: the rank with per-rank labels, else None (one set of counters for the job).
        self.series: dict[int | None, SeriesAcc] = {}
        # The launches this job ran under, and its restarts (see `_incarnations`).
        self.incarnations = JobIncarnations()
        # Every axis this job's batches named while it lives (bounded by `max_axes_per_job`).
        self.axes: set[str] = set()
        # Flight-recorder traffic totals of every rank seen (see `_traffic`), the entries the
        # agents' recorders overwrote unread, and the arrival-skew join (see `_arrivals`).
        self.traffic = TrafficLedger()
        self.records_lost = HealthLedger(width=1)
        self.arrivals = ArrivalJoin(sample_s=arrival_sample_s)
        # Each rank's latest process as the job-time ledger booked it (core.ledger): kept while
        # the job lives, past the rank's expiry, so a replacement's down counts.
        self.processes: dict[int, ProcessTime] = {}


def batch_axes(batch: ReportBatch) -> set[str]:
    """The parallelism axes a batch names (each becomes a label value)."""
    axes = {c.axis for r in batch.reports for c in r.components if c.axis}
    axes.update(c.axis for r in batch.reports for c in r.collectives)
    if batch.topology is not None:
        axes.update(g.axis for g in batch.topology.groups)
    if batch.comm is not None:
        axes.update(t.axis for t in batch.comm.traffic)
        axes.update(g.axis for g in batch.comm.groups)
    return axes


class AggregationState:
    """All jobs this collector has live ranks for, plus collector-wide rejection counts."""

    def __init__(self, config: StateConfig | None = None) -> None:
        self.config = config or StateConfig()
        self.jobs: dict[str, JobState] = {}
        self.rejected: dict[str, int] = {}
        # Ranks by time of their latest batch, oldest first: expiry pops from the front.
        self._by_last_seen: OrderedDict[tuple[str, int], RankState] = OrderedDict()

    def apply(self, batch: ReportBatch, now_s: float, now_unix_ns: int) -> IngestResult:
        """Count a validated batch whole. Re-sent steps of ``(job, incarnation, rank)`` are
        acknowledged as duplicates and not counted; steps a relaunch runs again are counted, and
        also as reruns (see `_incarnations`). Raises `OverLimit`, changing nothing, for a batch
        past a cardinality limit; otherwise cannot fail part-way (the parser validated it)."""
        self.expire(now_s)
        axes = self._admit(batch)
        job = self.jobs.get(batch.job)
        if job is None:
            job = self.jobs[batch.job] = JobState(
                batch.job, now_unix_ns, self.config.arrival_sample_s
            )
        job.axes.update(axes)
        rank = job.ranks.get(batch.rank)
        if rank is None:
            rank = job.ranks[batch.rank] = RankState(
                batch.job,
                batch.rank,
                window_steps=self.config.window_steps,
                idempotency_steps=self.config.idempotency_steps,
            )
        who = batch.rank if self.config.per_rank_labels else None
        series = job.series.get(who)
        if series is None:
            series = job.series[who] = SeriesAcc(now_unix_ns)

        rank.update_metadata(batch, now_s)
        job.health.update(batch.rank, health_counts(batch.health), now_unix_ns)
        if batch.hardware is not None:
            job.hardware.update(batch.rank, batch.hardware)
        key = (batch.job, batch.rank)
        self._by_last_seen[key] = rank
        self._by_last_seen.move_to_end(key)

        comm = batch.comm
        # Without flight-recorder records a window's samples count whole; with them, the records
        # carry the traffic (and, with durations, the times) and windows add the rest.
        parts = ALL_PARTS if comm is None else (WINDOW if comm.durations else TIMES | WINDOW)
        p2p_parts = parts if comm is not None and comm.p2p_recorded else ALL_PARTS
        if comm is not None:
            for grown in job.traffic.increments(batch.rank, comm.traffic):
                series.add_traffic(grown, times=comm.durations)
            job.records_lost.update(batch.rank, (comm.lost_total,), now_unix_ns)
            job.arrivals.add(batch.rank, comm.arrivals, comm.groups)
        accepted = duplicates = reruns = 0
        number = job.incarnations.number(batch.incarnation)
        window, redone_up_to = rank.incarnations.window(number, job.incarnations.oldest_kept)
        steps: list[tuple[int, bool]] = []  # (wall ns, redone) of the new steps, for the ledger
        for report in batch.reports:
            if window is None or not window.is_new(report.step):
                duplicates += 1
                continue
            window.add(report.step)
            redone = report.step <= redone_up_to
            if redone:
                reruns += 1
            else:
                series.useful_model_flops += report.model_flops
            steps.append((wall_ns(report.wall_s), redone))
            series.add(report, rank.peak_flops, parts, p2p_parts)
            rank.add(report, now_s)
            accepted += 1
        groups = comm.groups if comm is not None else None
        process, booked = book_batch(
            job.processes.get(batch.rank), number, batch.ledger, steps, groups
        )
        if process is not None:
            job.processes[batch.rank] = process
        series.add_time(booked, rank.peak_flops)
        old = rank.contribution
        rank.refresh()
        job.sums.replace(old, rank.contribution)
        if job.sums.updates >= REBUILD_EVERY:
            job.sums.rebuild(r.contribution for r in job.ranks.values())
        series.duplicates += duplicates
        series.reruns += reruns
        return IngestResult(accepted=accepted, duplicates=duplicates, reruns=reruns)

    def _admit(self, batch: ReportBatch) -> set[str]:
        """Refuse a batch that would pass a cardinality limit; returns the axes it names."""
        config = self.config
        # Jobs and ranks free up as silent ones expire: the agent should retry after that.
        retry_s = config.expire_after_s
        job = self.jobs.get(batch.job)
        if job is None and len(self.jobs) >= config.max_jobs:
            raise OverLimit(
                "job",
                f"the collector already tracks {config.max_jobs} jobs (max_jobs)",
                reason="too_many_jobs",
                retry_after_s=retry_s,
            )
        ranks = job.ranks if job is not None else {}
        if batch.rank not in ranks and len(ranks) >= config.max_ranks_per_job:
            raise OverLimit(
                "rank",
                f"job already has {config.max_ranks_per_job} live ranks (max_ranks_per_job)",
                reason="too_many_ranks",
                retry_after_s=retry_s,
            )
        axes = batch_axes(batch)
        known = job.axes if job is not None else set()
        if len(known | axes) > config.max_axes_per_job:
            raise OverLimit(
                "axis",
                f"more than {config.max_axes_per_job} distinct axes in one job (max_axes_per_job)",
                reason="too_many_axes",
            )
        return axes

    def reject(self, reason: str) -> None:
        """Count one refused batch under `reason`."""
        self.rejected[reason] = self.rejected.get(reason, 0) + 1

    def expire(self, now_s: float) -> int:
        """Drop ranks silent for longer than `expire_after_s` (with per-rank labels, their series),
        and jobs left without ranks. Returns how many ranks were dropped. A rank's counts stay in
        its job's counters (and health ledger) until the job itself is dropped."""
        deadline = now_s - self.config.expire_after_s
        dropped = 0
        while self._by_last_seen:
            key, rank = next(iter(self._by_last_seen.items()))
            if rank.last_seen_s >= deadline:
                break
            del self._by_last_seen[key]
            job = self.jobs[rank.job]
            del job.ranks[rank.rank]
            job.sums.replace(rank.contribution, ())
            job.arrivals.forget(rank.rank)
            if self.config.per_rank_labels:
                del job.series[rank.rank]
            if not job.ranks:
                del self.jobs[rank.job]
            dropped += 1
        return dropped
