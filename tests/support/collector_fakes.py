"""Helpers for tests that feed or read the collector: a settable clock and a batch builder.

The tests of every part (collector, exporters, agent transport, benchmarks) build valid wire
batches with them and drive an `Aggregator` without sleeping.
"""

from __future__ import annotations

import copy
from typing import Any

from mfuscope.core.schema import SCHEMA_NAME, SCHEMA_VERSION

__all__ = ["FakeClock", "batch_dict", "report_dict"]


class FakeClock:
    """A `Clock` that moves only when told: `advance(seconds)`."""

    def __init__(
        self, monotonic_s: float = 1000.0, unix_ns: int = 1_763_700_000_000_000_000
    ) -> None:
        self._mono = monotonic_s
        self._unix_ns = unix_ns

    def monotonic(self) -> float:
        return self._mono

    def time_ns(self) -> int:
        return self._unix_ns

    def advance(self, seconds: float) -> None:
        if seconds < 0:
            raise ValueError("time does not go backwards")
        self._mono += seconds
        self._unix_ns += round(seconds * 1e9)


def report_dict(
    step: int,
    *,
    wall_s: float = 1.0,
    model_flops: float = 4e11,
    recompute_flops: float = 1e11,
    compute_fraction: float = 0.75,
    exposed: tuple[str, str] | None = ("dp", "intra_node"),
    collectives: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """One step report in wire form: `compute_fraction` of the step computing, the rest exposed
    communication on `exposed` = (axis, tier) (or idle bubble when None)."""
    rest = {"component": "bubble_idle", "seconds": wall_s * (1 - compute_fraction)}
    if exposed is not None:
        rest = {
            "component": "exposed_comm",
            "axis": exposed[0],
            "tier": exposed[1],
            "seconds": wall_s * (1 - compute_fraction),
        }
    report: dict[str, Any] = {
        "step": step,
        "start_unix_ns": 1_763_700_000_000_000_000 + step * 1_000_000_000,
        "wall_s": wall_s,
        "model_flops": model_flops,
        "recompute_flops": recompute_flops,
        "components": [{"component": "compute", "seconds": wall_s * compute_fraction}, rest],
    }
    if collectives is not None:
        report["collectives"] = copy.deepcopy(collectives)
    return report


def batch_dict(
    *,
    job: str = "job-a",
    rank: int = 0,
    world_size: int = 2,
    steps: range | list[int] = range(1, 3),
    peak_flops: float | None = 1e12,
    host: str = "node-0",
    reports: list[dict[str, Any]] | None = None,
    **fields: Any,
) -> dict[str, Any]:
    """A valid batch in wire form (JSON-ready dict); `reports` overrides the default reports
    built by `report_dict` for each of `steps`; extra keyword `fields` override top-level ones."""
    batch: dict[str, Any] = {
        "schema": SCHEMA_NAME,
        "version": SCHEMA_VERSION,
        "job": job,
        "rank": rank,
        "world_size": world_size,
        "local_rank": rank,
        "host": host,
        "device": "NVIDIA H100 80GB HBM3" if peak_flops else "unknown",
        "peak_flops": peak_flops,
        "peak_source": "spec" if peak_flops else "unknown",
        "sent_unix_ns": 1_763_700_000_000_000_000,
        "health": {
            "reports_dropped_total": 0,
            "send_failures_total": 0,
            "profiler_failures_total": 0,
            "windows_analysed_total": 0,
        },
        "reports": reports if reports is not None else [report_dict(s) for s in steps],
    }
    batch.update(fields)
    return batch
