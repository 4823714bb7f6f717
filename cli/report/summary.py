"""The report's story in a few plain lines, for `mfuscope report` and the end of `mfuscope demo`.

One headline MFU (every step of every rank: the run's MFU), against the peak said once (or, when
the ranks' peaks differ, each with its ranks); every other figure says what it covers and how it
relates to the headline: the decomposition and the waterfall are over the steps measured in
profiled windows (how many, and how many carry an earlier window's breakdown; the waterfall's MFU
is those steps' own), the straggler ratio over each rank's last reports, named a straggler only
above the alert's threshold. Pure over `ReportContent` (no plotting).
"""

from __future__ import annotations

from mfuscope.cli.report._content import ReportContent
from mfuscope.core.run_summary.breakdowns import segment_label
from mfuscope.core.stragglers import STRAGGLER_MIN_RATIO
from mfuscope.core.vocabulary import COMPONENTS

__all__ = ["describe_run", "headline_mfu", "job_time_line", "peak_words", "straggler_line"]


def _plural(count: int, word: str) -> str:
    return f"{count} {word}" + "s" * (count != 1)


def _pct(value: float | None) -> str:
    return "unknown" if value is None else f"{value:.1%}"


def peak_words(content: ReportContent) -> str:
    """The peak the run's MFU is against, said once: ``peak 104.5 GFLOP/s per rank (measured)``,
    or each peak with its ranks when they differ."""
    by_peak: dict[tuple[float, str], list[int]] = {}
    for r in content.run.ranks:
        if r.peak_flops:
            by_peak.setdefault((r.peak_flops, r.peak_source), []).append(r.rank)
    if len(by_peak) == 1:
        ((peak, source),) = by_peak
        return f"peak {_rate(peak)} per rank ({source})"
    parts = [
        f"{_rate(peak)} ({source}) on rank{'s' * (len(ranks) > 1)} {', '.join(map(str, ranks))}"
        for (peak, source), ranks in sorted(by_peak.items())
    ]
    return f"peaks differ between ranks: {'; '.join(parts)} (each rank's MFU is against its own)"


def headline_mfu(content: ReportContent) -> str:
    """The run's MFU and HFU over every step, with the peak they are against."""
    run = content.run
    if content.overall is None:
        why = content.missing("utilization") or "unknown"
        return f"MFU unknown: {why}"
    effective = run.job_time.effective_mfu
    beside = (
        "" if effective is None else f"; effective MFU {_pct(effective)} over every rank-second"
    )
    return (
        f"MFU {_pct(content.overall[0])}  HFU {_pct(content.overall[1])}  over all "
        f"{run.step_reports} rank-steps (the run's MFU; HFU adds recomputation){beside}; "
        f"{peak_words(content)}; from {run.source}"
    )


def job_time_line(content: ReportContent) -> str | None:
    """Where the ranks' time went (the job-time ledger's shares), with effective MFU; None when
    no agent sent a ledger."""
    time = content.run.job_time
    if not time.rank_seconds > 0:
        return None
    shares = ", ".join(f"{category} {_pct(share)}" for category, share in time.shares())
    return (
        f"job time: {time.rank_seconds:.1f} rank-seconds: {shares}; effective MFU "
        f"{_pct(time.effective_mfu)} (useful model FLOPs over the peak x every rank-second)"
    )


def _rate(flops_per_s: float) -> str:
    scale, prefix = next(
        ((f, p) for f, p in ((1e15, "P"), (1e12, "T"), (1e9, "G")) if flops_per_s >= f),
        (1e6, "M"),
    )
    return f"{flops_per_s / scale:.4g} {prefix}FLOP/s"


def straggler_line(content: ReportContent) -> str:
    """Who is a straggler (above the threshold), else which rank is slowest and by how much."""
    view = content.stragglers
    basis = "own time" if view.basis == "self" else "step wall time"
    window = max((p.recent_steps for p in view.ranks), default=0)
    over = f"median {basis} over each rank's last {window} reports"
    if view.named:
        names = ", ".join(f"rank {s.rank} ×{s.ratio:.3f}" for s in view.named)
        return f"stragglers: {names} the job median ({over})"
    slow = view.slowest
    if slow is None:
        return "stragglers: none (nothing to compare: fewer than two ranks)"
    return (
        f"stragglers: none above ×{STRAGGLER_MIN_RATIO:.2f}; slowest rank {slow.rank} at "
        f"×{slow.ratio:.3f} the job median ({over})"
    )


def _buckets(content: ReportContent) -> str:
    """Each bucket's share of the measured steps (mean over ranks), exposed comm by axis/tier."""
    ranks = content.decomposition
    parts = []
    for component in COMPONENTS:
        share = sum(r.fraction(component) for r in ranks) / len(ranks)
        if not share:
            continue
        text = f"{segment_label(component)} {_pct(share)}"
        if component == "exposed_comm":
            split = [
                (
                    seg.axis,
                    seg.tier,
                    sum(r.segments[i].seconds / r.mean_step_s for r in ranks if r.mean_step_s > 0),
                )
                for i, seg in enumerate(ranks[0].segments)
                if seg.component == component
            ]
            text += " (" + ", ".join(f"{a}/{t} {_pct(v / len(ranks))}" for a, t, v in split) + ")"
        parts.append(text)
    return " · ".join(parts)


def describe_run(content: ReportContent) -> list[str]:
    """The report's figures as lines: launches, MFU, breakdown coverage, buckets, waterfall,
    stragglers."""
    run = content.run
    lines = [
        f"job {run.job!r}: {len(run.ranks)} of {run.world_size} ranks, {run.step_count} steps "
        f"({run.step_reports} rank-steps)"
    ]
    launches = run.launches
    if launches.restarts:
        lines.append(
            f"  launches: {launches.restarts + 1} ({_plural(launches.restarts, 'restart')}); "
            f"{launches.rerun_steps} of the {launches.step_reports} rank-steps re-ran steps an "
            "earlier launch had reported"
        )
    lines.append("  " + headline_mfu(content))
    job_time = job_time_line(content)
    if job_time is not None:
        lines.append("  " + job_time)
    lines.append(f"  breakdowns: {content.coverage.describe()}")
    if content.decomposition:
        lines.append("  step (measured steps, mean over ranks): " + _buckets(content))
    waterfall = content.waterfall
    if waterfall is not None:
        slices = " − ".join(
            f"{s.label} {_pct(s.fraction)}" for s in waterfall.slices if abs(s.fraction) >= 5e-4
        )
        run_mfu = "" if content.overall is None else f"; the run's is {_pct(content.overall[0])}"
        lines.append(
            f"  waterfall ({waterfall.samples} measured rank-steps): MFU {_pct(waterfall.mfu)} = "
            f"100% − {slices} (these profiled steps' own MFU, instrumentation included{run_mfu})"
        )
    if content.stragglers.ranks:
        lines.append("  " + straggler_line(content))
    return lines
