"""What the framework jobs (`hf_job.py`, `lightning_job.py`) train: one shape, given on the
command line by the test that derives the expected FLOPs from it."""

from __future__ import annotations

import argparse
from dataclasses import dataclass, fields
from pathlib import Path

__all__ = ["JobShape", "agent_options", "parse_job_args"]


@dataclass(frozen=True)
class JobShape:
    layers: int = 2
    width: int = 64
    heads: int = 4
    vocab: int = 256
    seq_len: int = 32
    batch: int = 4  # sequences per rank per micro-batch
    micro_batches: int = 6  # per rank in the one epoch

    @property
    def tokens_per_micro_batch(self) -> int:
        return self.batch * self.seq_len

    def args(self) -> list[str]:
        return [f"--{f.name.replace('_', '-')}={getattr(self, f.name)}" for f in fields(self)]


def parse_job_args(runs_help: str) -> tuple[argparse.Namespace, JobShape]:
    """`--collector-url`, `--out`, `--runs` (strings, meaning per job) and the shape."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--collector-url", required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--runs", nargs="+", required=True, help=runs_help)
    for f in fields(JobShape):
        parser.add_argument(f"--{f.name.replace('_', '-')}", type=int, default=f.default)
    options = parser.parse_args()
    shape = JobShape(**{f.name: getattr(options, f.name) for f in fields(JobShape)})
    return options, shape


def agent_options(job: str, collector_url: str, out: Path) -> dict[str, object]:
    """The callback options of every test job: collector and JSONL, no profiling, a fixed peak
    (the test checks FLOPs, not the machine), quick flushes."""
    return {
        "job": job,
        "collector_url": collector_url,
        "jsonl_path": str(out / f"{job}-{{rank}}.jsonl"),
        "profile": False,
        "calibrate_cpu_peak": False,
        "peak_flops": 1e11,
        "flush_interval_s": 0.2,
    }
