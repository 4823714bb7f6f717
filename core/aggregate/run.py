"""The report's input model: one job's step reports per rank, merged from agent batches (pure).

An agent writes many batches per rank (one JSONL line each, the collector wire format); a run's
data is the union of their step reports, deduplicated on the idempotency key `(job, rank, step)`
exactly as the collector does (the first copy wins), with the latest health counters and topology.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from mfuscope.core.errors import ReportInputError
from mfuscope.core.schema import AgentHealth, ReportBatch, StepReport, Topology

__all__ = ["RankRun", "RunData", "merge_batches"]


@dataclass(frozen=True)
class RankRun:
    """Everything known about one rank: identity, device peak, and its steps sorted by step."""

    rank: int
    host: str
    device: str
    peak_flops: float | None  # dense peak FLOP/s of the device for the training dtype
    peak_source: str  # "spec", "measured", "user" or "unknown" (vocabulary.PEAK_SOURCES)
    steps: tuple[StepReport, ...]
    health: AgentHealth = field(default_factory=AgentHealth)
    topology: Topology | None = None


@dataclass(frozen=True)
class RunData:
    """One job as the report sees it. `flops_known` is False when model FLOPs were not given."""

    job: str
    world_size: int
    ranks: tuple[RankRun, ...]
    source: str
    flops_known: bool = True

    @property
    def step_count(self) -> int:
        return len({s.step for r in self.ranks for s in r.steps})


def jobs_in(batches: Iterable[ReportBatch]) -> list[str]:
    """Job names present in `batches`, sorted."""
    return sorted({b.job for b in batches})


def merge_batches(
    batches: Iterable[ReportBatch], job: str | None = None, source: str = ""
) -> RunData:
    """Merge agent batches into one job's `RunData`.

    `job=None` takes the only job present and raises `ReportInputError` when there are several.
    Duplicate `(rank, step)` reports keep the first copy seen; health and topology come from each
    rank's most recently sent batch (health counters are cumulative, so the latest is the total).
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
    mine = [b for b in batch_list if b.job == job]
    world_size = max(b.world_size for b in mine)
    by_rank: dict[int, list[ReportBatch]] = {}
    for batch in mine:
        by_rank.setdefault(batch.rank, []).append(batch)
    ranks = []
    for rank in sorted(by_rank):
        rank_batches = by_rank[rank]
        steps: dict[int, StepReport] = {}
        for batch in rank_batches:
            for report in batch.reports:
                steps.setdefault(report.step, report)
        latest = max(rank_batches, key=lambda b: b.sent_unix_ns)
        topologies = [b for b in rank_batches if b.topology is not None]
        topology = max(topologies, key=lambda b: b.sent_unix_ns).topology if topologies else None
        ranks.append(
            RankRun(
                rank=rank,
                host=latest.host,
                device=latest.device,
                peak_flops=latest.peak_flops,
                peak_source=latest.peak_source,
                steps=tuple(steps[s] for s in sorted(steps)),
                health=latest.health,
                topology=topology,
            )
        )
    return RunData(job=job, world_size=world_size, ranks=tuple(ranks), source=source)
