"""The collector's aggregation state: counters per job (or per rank), and a little per rank.

Pure in the house sense: no clock reads, no I/O, no logging; the caller passes the time in
(`now_s` from a monotonic clock for ages and expiry, `now_unix_ns` from the wall clock for series
start times). Not thread-safe: the caller holds one lock around `apply`, `expire`, `snapshot`.

Memory is bounded by live ranks, not by reports: per rank a 512-byte idempotency window, the last
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

from mfuscope.collector._accumulators import SeriesAcc
from mfuscope.collector._health import HealthLedger, health_counts
from mfuscope.collector._rank import RankState
from mfuscope.collector._sums import REBUILD_EVERY, CountedSums
from mfuscope.collector._window import DEFAULT_WIDTH
from mfuscope.core.schema import ReportBatch

__all__ = ["AggregationState", "IngestResult", "StateConfig"]


@dataclass(frozen=True)
class StateConfig:
    """Aggregation settings. `window_steps`: steps per rank behind the latest-window MFU and the
    straggler times; `straggler_top`: how many slowest ranks to expose; `idempotency_steps`: how
    far below a rank's highest step a re-sent step is still recognised individually."""

    per_rank_labels: bool = False
    expire_after_s: float = 300.0
    window_steps: int = 20
    straggler_top: int = 3
    idempotency_steps: int = DEFAULT_WIDTH

    def __post_init__(self) -> None:
        if not (self.expire_after_s > 0 and math.isfinite(self.expire_after_s)):
            raise ValueError(f"expire_after_s must be a positive number, got {self.expire_after_s}")
        if self.window_steps < 1:
            raise ValueError(f"window_steps must be >= 1, got {self.window_steps}")
        if self.straggler_top < 0:
            raise ValueError(f"straggler_top must be >= 0, got {self.straggler_top}")
        if self.idempotency_steps < 1:
            raise ValueError(f"idempotency_steps must be >= 1, got {self.idempotency_steps}")


@dataclass(frozen=True)
class IngestResult:
    """Reports counted (`accepted`) and re-sent ones acknowledged but not counted (`duplicates`)."""

    accepted: int
    duplicates: int


class JobState:
    __slots__ = ("health", "name", "ranks", "series", "start_unix_ns", "sums")

    def __init__(self, name: str, start_unix_ns: int) -> None:
        self.name = name
        # When this job's counters started from zero (its first batch since it was last expired).
        self.start_unix_ns = start_unix_ns
        self.ranks: dict[int, RankState] = {}
        # Agent-health counters of every rank seen while the job lives (see `_health`).
        self.health = HealthLedger()
        # The live ranks' latest figures summed per job (see `_sums`).
        self.sums = CountedSums()
        # Key: the rank with per-rank labels, else None (one set of counters for the job).
        self.series: dict[int | None, SeriesAcc] = {}


class AggregationState:
    """All jobs this collector has live ranks for, plus collector-wide rejection counts."""

    def __init__(self, config: StateConfig | None = None) -> None:
        self.config = config or StateConfig()
        self.jobs: dict[str, JobState] = {}
        self.rejected: dict[str, int] = {}
        # Ranks by time of their latest batch, oldest first: expiry pops from the front.
        self._by_last_seen: OrderedDict[tuple[str, int], RankState] = OrderedDict()

    def apply(self, batch: ReportBatch, now_s: float, now_unix_ns: int) -> IngestResult:
        """Count a validated batch whole. Re-sent steps of ``(job, rank)`` are acknowledged as
        duplicates and not counted. Cannot fail part-way: the batch was validated by the parser."""
        self.expire(now_s)
        job = self.jobs.get(batch.job)
        if job is None:
            job = self.jobs[batch.job] = JobState(batch.job, now_unix_ns)
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
        key = (batch.job, batch.rank)
        self._by_last_seen[key] = rank
        self._by_last_seen.move_to_end(key)

        accepted = duplicates = 0
        window = rank.steps
        for report in batch.reports:
            if not window.is_new(report.step):
                duplicates += 1
                continue
            window.add(report.step)
            series.add(report, rank.peak_flops)
            rank.add(report)
            accepted += 1
        old = rank.contribution
        rank.refresh()
        job.sums.replace(old, rank.contribution)
        if job.sums.updates >= REBUILD_EVERY:
            job.sums.rebuild(r.contribution for r in job.ranks.values())
        series.duplicates += duplicates
        return IngestResult(accepted=accepted, duplicates=duplicates)

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
            if self.config.per_rank_labels:
                del job.series[rank.rank]
            if not job.ranks:
                del self.jobs[rank.job]
            dropped += 1
        return dropped
