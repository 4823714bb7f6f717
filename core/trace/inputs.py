"""Warnings about a set of traces analysed together (one file per rank of one job).

Nothing stops a user from giving the same file twice, or ranks of two unrelated runs: each file
is analysed on its own and would be reported beside the others without a word. These checks
compare the per-rank answers (pure, no I/O) and say what looks wrong; they never refuse.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence

from mfuscope.core.trace.result import RankAnalysis

__all__ = ["MIXED_JOB_GAP_S", "input_warnings"]

# Ranks of one job profile the same steps, seconds apart at most; an hour apart they are not
# one job's (Unix clocks only: a trace without baseTimeNanoseconds has its own clock).
MIXED_JOB_GAP_S = 3600.0
_UNIX_CLOCK_AFTER_S = 1e9  # 2001: a start_s past this is on the Unix clock


def input_warnings(named: Sequence[tuple[str, RankAnalysis]]) -> list[str]:
    """One line per problem among `(file name, analysis)` pairs: the same trace given twice,
    one rank in several files, disagreeing world sizes, windows far apart in time."""
    out: list[str] = []
    seen: dict[RankAnalysis, str] = {}
    files_of_rank: dict[int, list[str]] = defaultdict(list)
    for name, analysis in named:
        first = seen.get(analysis)
        if first is not None:
            out.append(f"{first} and {name} hold the same trace (the same file given twice?)")
            continue
        seen[analysis] = name
        files_of_rank[analysis.rank].append(name)
    for rank, names in sorted(files_of_rank.items()):
        if len(names) > 1:
            out.append(
                f"rank {rank} appears in {len(names)} different traces ({', '.join(names)}): "
                "ranks of unrelated jobs or runs?"
            )
    sizes = defaultdict(list)
    for name, analysis in named:
        sizes[analysis.world_size].append(name)
    if len(sizes) > 1:
        parts = "; ".join(f"{size} in {', '.join(names)}" for size, names in sorted(sizes.items()))
        out.append(f"the traces disagree on the world size ({parts}): ranks of unrelated jobs?")
    starts = [
        (analysis.steps[0].start_s, name)
        for name, analysis in named
        if analysis.steps and analysis.steps[0].start_s > _UNIX_CLOCK_AFTER_S
    ]
    if len(starts) > 1:
        (early, early_name), (late, late_name) = min(starts), max(starts)
        if late - early > MIXED_JOB_GAP_S:
            out.append(
                f"{late_name} starts {(late - early) / 3600:.1f} h after {early_name}: "
                "not the same profiled steps, ranks of unrelated runs?"
            )
    return out
