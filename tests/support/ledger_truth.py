"""The job-time ledger against a job's own clock: run `ledger_job.py` under torchrun twice (a rank
fails on the first launch, the second resumes from the last checkpoint) into one collector, and
compare the collector's counters with what the job's processes timed themselves.

Shared by tests/integration/test_job_time_ledger.py and benchmarks/job_time_ledger.py. The truth
side applies docs/definitions.md#job-time-ledger to the processes' own clock readings (their
start from /proc, each step's and phase's start and end, their end), written out here rather than
through mfuscope's code.
"""

from __future__ import annotations

import json
import re
import subprocess
import time
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from mfuscope.core.ledger import CATEGORIES

from tests.support.launch import job_command

__all__ = ["Figures", "Scenario", "collector_figures", "run_scenario", "truth_figures"]

SUPPORT = Path(__file__).resolve().parent


@dataclass(frozen=True)
class Scenario:
    """The job: steps 0..`steps` - 1; rank `exit_rank` fails after step `exit_after` on the
    first launch; a checkpoint every `save_every` steps, an evaluation every `eval_every`."""

    job: str = "ledger-truth"
    steps: int = 30
    exit_rank: int = 1
    exit_after: int = 19
    step_s: float = 0.1
    save_every: int = 8
    save_s: float = 0.4
    load_s: float = 0.3
    eval_every: int = 12
    eval_s: float = 0.3
    startup_s: float = 1.0
    flops_per_step: float = 4e9
    peak_flops: float = 1e11

    def args(self, out: Path, url: str, launch: int) -> list[str]:
        args = ["--job", self.job, "--collector-url", url, "--out", str(out)]
        args += ["--launch", str(launch), "--steps", str(self.steps)]
        args += ["--exit-rank", str(self.exit_rank), "--exit-after", str(self.exit_after)]
        for name in ("step_s", "save_every", "save_s", "load_s", "eval_every", "eval_s"):
            args += [f"--{name.replace('_', '-')}", str(getattr(self, name))]
        args += ["--startup-s", str(self.startup_s)]
        args += ["--flops-per-step", str(self.flops_per_step)]
        args += ["--peak-flops", str(self.peak_flops)]
        return args + (["--resume"] if launch == 2 else [])


@dataclass
class Figures:
    """Seconds per category summed over ranks, rank-seconds, useful FLOPs, peak x rank-seconds."""

    seconds: dict[str, float] = field(default_factory=lambda: dict.fromkeys(CATEGORIES, 0.0))
    rank_seconds: float = 0.0
    useful_flops: float = 0.0
    peak_flop_seconds: float = 0.0

    @property
    def effective_mfu(self) -> float:
        return self.useful_flops / self.peak_flop_seconds


def _inside(phases: Sequence[Sequence[int]], start: int, end: int) -> dict[str, int]:
    """Nanoseconds of each phase inside [start, end) (the job's phases never overlap)."""
    out: dict[str, int] = {}
    for name, low, high in ((p[0], p[1], p[2]) for p in phases):
        overlap = min(high, end) - max(low, start)
        if overlap > 0:
            out[str(name)] = out.get(str(name), 0) + overlap
    return out


def _process(doc: dict, redone_up_to: int, ns: dict[str, int]) -> None:
    """Book one process's own clock readings: each region (startup, each step to the next
    step's start, the last step to its end, shutdown) less the phases inside it."""
    start, end = doc["process_start_ns"], doc["end_ns"]
    steps = sorted(doc["steps"], key=lambda s: s[1])
    regions: list[tuple[str, int, int]] = []
    if not steps:
        regions.append(("startup", start, end))
    else:
        regions.append(("startup", start, steps[0][1]))
        for (n, s, _), following in zip(steps, [*steps[1:], None], strict=True):
            kind = "redone_step" if n <= redone_up_to else "step"
            regions.append((kind, s, following[1] if following else steps[-1][2]))
        regions.append(("shutdown", steps[-1][2], end))
    for owner, low, high in regions:
        phases = _inside(doc["phases"], low, high)
        ns[owner] += (high - low) - sum(phases.values())
        for name, phase_ns in phases.items():
            ns[name] += phase_ns


def truth_figures(out: Path, scenario: Scenario) -> Figures:
    """The figures the job's own clock gives (docs/definitions.md#job-time-ledger applied to
    the `truth-<launch>-<rank>.json` files)."""
    ns = dict.fromkeys(CATEGORIES, 0)
    figures = Figures()
    for rank in (0, 1):
        docs = [json.loads((out / f"truth-{launch}-{rank}.json").read_text()) for launch in (1, 2)]
        first, second = docs
        high = max(s[0] for s in first["steps"])
        _process(first, -1, ns)
        _process(second, high, ns)
        ns["down"] += second["process_start_ns"] - first["end_ns"]
        span = (second["end_ns"] - first["process_start_ns"]) / 1e9
        figures.rank_seconds += span
        distinct = {s[0] for d in docs for s in d["steps"]}
        figures.useful_flops += len(distinct) * scenario.flops_per_step
        figures.peak_flop_seconds += span * scenario.peak_flops
    figures.seconds = {c: v / 1e9 for c, v in ns.items()}
    return figures


def collector_figures(url: str, job: str) -> Figures:
    """The collector's job-time counters for `job`."""
    with urllib.request.urlopen(f"{url}/metrics", timeout=30) as response:
        text = response.read().decode()
    figures = Figures()
    for category, value in re.findall(
        rf'^mfuscope_job_rank_seconds_total{{category="(\w+)",job="{job}"}} (\S+)$', text, re.M
    ):
        figures.seconds[category] = float(value)
    figures.rank_seconds = sum(figures.seconds.values())

    def counter(name: str) -> float:
        (value,) = re.findall(rf'^{name}{{job="{job}"}} (\S+)$', text, re.M)
        return float(value)

    figures.useful_flops = counter("mfuscope_useful_model_flops_total")
    figures.peak_flop_seconds = counter("mfuscope_job_peak_flop_seconds_total")
    return figures


def run_scenario(out: Path, url: str, scenario: Scenario, timeout_s: float = 300) -> float:
    """Both launches, one after the other; returns their wall time (s). The first must fail."""
    began = time.monotonic()
    for launch in (1, 2):
        # Real torchrun: its start-up and its stopping of the failed launch's survivor are part
        # of the job time the ledger books (startup, down).
        args = scenario.args(out, url, launch)
        command, env = job_command(SUPPORT / "ledger_job.py", *args, temp=out, torchrun=True)
        done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=timeout_s)
        failed = done.returncode != 0
        if failed != (launch == 1):
            raise AssertionError(f"launch {launch}: rc {done.returncode}\n{done.stderr[-4000:]}")
    return time.monotonic() - began
