"""The report's input model: one job's step reports per rank, merged from agent batches (pure).

An agent writes many batches per rank (one JSONL line each, the collector wire format); a run's
data is the union of their step reports, counted exactly as the collector counts them
(docs/collector.md, "Idempotency" and "Restarts"):

- the idempotency key is `(job, incarnation, rank, step)`: a re-sent report (same launch, same
  step) counts once, the first copy winning;
- incarnations (launches of the job's agents) are numbered in the order their first batch was
  sent; each one after the first is a restart;
- a step a later launch reports at or below the highest step an earlier launch reported on that
  rank is a *re-run* step: redone work, counted as work and as a re-run, never as a duplicate.

The batches are replayed in the order they were sent (`sent_unix_ns`, the input order breaking
ties), the order the collector receives them in. Health and topology come from each rank's
most recently sent batch.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from mfuscope.core.errors import ReportInputError
from mfuscope.core.ledger import ProcessTime, book_batch, wall_ns
from mfuscope.core.run_summary.job_time import JobTime, JobTimeTally
from mfuscope.core.schema import AgentHealth, ReportBatch, StepReport, Topology
from mfuscope.core.stragglers import DEFAULT_WINDOW_STEPS

__all__ = ["Launches", "RankRun", "RunData", "merge_batches"]


@dataclass(frozen=True)
class RankRun:
    """Everything known about one rank: identity, device peak, and its steps sorted by step (a
    step a relaunch ran again appears once per launch, the earlier launch first)."""

    rank: int
    host: str
    device: str
    peak_flops: float | None  # dense peak FLOP/s of the device for the training dtype
    peak_source: str  # "spec", "measured", "user" or "unknown" (vocabulary.PEAK_SOURCES)
    steps: tuple[StepReport, ...]
    health: AgentHealth = field(default_factory=AgentHealth)
    topology: Topology | None = None
    # The rank's last step reports in the order its agent sent them, at most
    # `DEFAULT_WINDOW_STEPS`: the window its straggler ratio is measured over (core.stragglers).
    recent: tuple[StepReport, ...] = ()
    run_key: str = ""  # the rank's latest run key (docs/compare.md); "": none sent
    # (kernel family, mean kernel seconds per step) from traces (largest first); agents send none.
    kernel_families: tuple[tuple[str, float], ...] = ()


@dataclass(frozen=True)
class Launches:
    """How the job's launches add up: `step_reports` counted (the collector's steps total, all
    launches and ranks), `rerun_steps` of them redone after a restart, `duplicates` re-sent
    reports ignored, `restarts` launches after the first."""

    step_reports: int = 0
    rerun_steps: int = 0
    duplicates: int = 0
    restarts: int = 0


@dataclass(frozen=True)
class RunData:
    """One job as the report sees it. `flops_known` is False when model FLOPs were not given."""

    job: str
    world_size: int
    ranks: tuple[RankRun, ...]
    source: str
    flops_known: bool = True
    launches: Launches = field(default_factory=Launches)
    # The job-time ledger as the collector would book these batches (docs/definitions.md).
    job_time: JobTime = field(default_factory=JobTime)

    @property
    def step_count(self) -> int:
        """Distinct step numbers reported (a re-run step counts once here)."""
        return len({s.step for r in self.ranks for s in r.steps})

    @property
    def step_reports(self) -> int:
        """Step reports of every rank and launch (a re-run step counts once per launch)."""
        return sum(len(r.steps) for r in self.ranks)


def jobs_in(batches: Iterable[ReportBatch]) -> list[str]:
    """Job names present in `batches`, sorted."""
    return sorted({b.job for b in batches})


@dataclass
class _RankReplay:
    """One rank's reports as the collector would count them (mutable, within `merge_batches`)."""

    counted: list[StepReport] = field(default_factory=list)
    seen: dict[int, set[int]] = field(default_factory=dict)  # launch -> steps reported
    highest: dict[int, int] = field(default_factory=dict)  # launch -> highest step reported
    reruns: int = 0
    duplicates: int = 0
    process: ProcessTime | None = None  # the rank's latest process in the job-time ledger

    def take(self, launch: int, report: StepReport) -> bool | None:
        """Count `report`: None for a re-send, else whether it re-ran an earlier launch's step."""
        seen = self.seen.setdefault(launch, set())
        if report.step in seen:
            self.duplicates += 1
            return None
        seen.add(report.step)
        earlier = max((h for n, h in self.highest.items() if n < launch), default=-1)
        redone = report.step <= earlier
        self.reruns += redone
        self.highest[launch] = max(self.highest.get(launch, -1), report.step)
        self.counted.append(report)
        return redone

    def book(self, launch: int, batch: ReportBatch, tally: JobTimeTally) -> None:
        """Take the batch's steps and ledger into the job-time ledger, as the collector does."""
        steps = []
        for report in batch.reports:
            redone = self.take(launch, report)
            if redone is None:
                continue
            steps.append((wall_ns(report.wall_s), redone))
            if not redone:
                tally.useful_model_flops += report.model_flops
        groups = batch.comm.groups if batch.comm is not None else None
        process, booked = book_batch(self.process, launch, batch.ledger, steps, groups)
        self.process = process or self.process
        tally.add(booked, batch.peak_flops)


def merge_batches(
    batches: Iterable[ReportBatch],
    job: str | None = None,
    source: str = "",
    *,
    window_steps: int = DEFAULT_WINDOW_STEPS,
) -> RunData:
    """Merge agent batches into one job's `RunData` (the rules in the module docstring).

    `job=None` takes the only job present and raises `ReportInputError` when there are several.
    Health and topology come from each rank's most recently sent batch (health counters are
    cumulative, so the latest is the total).
    """
    batch_list = list(batches)
    if not batch_list:
        raise ReportInputError("no agent batches found")
    names = jobs_in(batch_list)
    if job is None:
        if len(names) > 1:
            raise ReportInputError(f"several jobs in the input ({', '.join(names)}): pick one")
        job = names[0]
    elif job not in names:
        raise ReportInputError(f"job {job!r} not in the input (found: {', '.join(names)})")
    mine = sorted((b for b in batch_list if b.job == job), key=lambda b: b.sent_unix_ns)
    launch_of: dict[str, int] = {}
    replays: dict[int, _RankReplay] = {}
    by_rank: dict[int, list[ReportBatch]] = {}
    tally = JobTimeTally()
    for batch in mine:
        launch = launch_of.setdefault(batch.incarnation, len(launch_of))
        by_rank.setdefault(batch.rank, []).append(batch)
        replays.setdefault(batch.rank, _RankReplay()).book(launch, batch, tally)
    ranks = []
    for rank in sorted(by_rank):
        rank_batches = by_rank[rank]
        latest = rank_batches[-1]  # sorted by sent time
        topologies = [b.topology for b in rank_batches if b.topology is not None]
        counted = replays[rank].counted
        ranks.append(
            RankRun(
                rank=rank,
                host=latest.host,
                device=latest.device,
                peak_flops=latest.peak_flops,
                peak_source=latest.peak_source,
                steps=tuple(sorted(counted, key=lambda s: s.step)),
                health=latest.health,
                topology=topologies[-1] if topologies else None,
                recent=tuple(counted[-window_steps:]),
                run_key=next((b.run_key for b in reversed(rank_batches) if b.run_key), ""),
            )
        )
    launches = Launches(
        step_reports=sum(len(r.counted) for r in replays.values()),
        rerun_steps=sum(r.reruns for r in replays.values()),
        duplicates=sum(r.duplicates for r in replays.values()),
        restarts=max(len(launch_of) - 1, 0),
    )
    return RunData(
        job=job,
        world_size=max(b.world_size for b in mine),
        ranks=tuple(ranks),
        source=source,
        launches=launches,
        job_time=tally.result(),
    )
