"""A simulated job of many ranks over per-node sidecar collectors, for the hang-at-scale test
(`tests/integration/prometheus/test_sidecar_scale.py`) and its benchmark
(`benchmarks/sidecar_hangs.py`).

Each sidecar is an in-process `Aggregator` (the collector's state and metric contract) on the
given clock. `Fleet.send_due(now)` sends what each rank's agent would by then: a batch every 5 s
with its steps (1 s each) and its progress per process group while it trains, its status every
10 s once it stops. The layout has no node-mate in any group: each rank is in its column group
across all sidecars (``col{local}``, axis dp, one rank per sidecar) and in the world group. At
`stall_at` rank `STALLED` stops outside any collective; the other ranks of its column wait in the
column's next all_reduce; every other rank stops too, blocked in nothing the recorder sees (as
pipeline stages waiting in send/recv on gloo). No sidecar can name the stalled rank from its own
ranks.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

from mfuscope.collector import Aggregator, StateConfig
from mfuscope.collector._clock import Clock
from mfuscope.exporters.model import MetricFamily, Sample

from tests.support.collector_fakes import batch_dict, report_dict

__all__ = ["JOB", "STALLED", "Fleet"]

STALLED = 17
JOB = "bench-hang"
BATCH_EVERY_S, STATUS_EVERY_S = 5.0, 10.0


class Fleet:
    """`ranks` over sidecars of `per_sidecar` ranks; the stall begins at `stall_at` (clock s)."""

    def __init__(self, ranks: int, per_sidecar: int, clock: Clock, stall_at: float) -> None:
        self.ranks, self.per = ranks, per_sidecar
        self.clock = clock
        self.sidecars = [
            Aggregator(StateConfig(), clock=clock) for _ in range(ranks // per_sidecar)
        ]
        self.columns = ranks // per_sidecar  # ranks per column group (one per sidecar)
        self.start = clock.monotonic()
        self.stall_at = stall_at
        self.stall_step = int(stall_at - self.start)
        # Each rank's next send, staggered over the first 5 s as agents' flushes are.
        self._due = [self.start + BATCH_EVERY_S * r / ranks for r in range(ranks)]

    def stalled(self, now: float) -> bool:
        return now >= self.stall_at

    def _groups(self, rank: int, step: int, now: float) -> list[dict[str, Any]]:
        """Progress on the column group (2 all_reduces a step) and the world group (1)."""
        column = rank % self.per
        entered, pending = 2 * step, None
        if self.stalled(now) and column == STALLED % self.per:
            entered = 2 * self.stall_step + (0 if rank == STALLED else 1)
            if rank != STALLED:
                waited = now - self.stall_at
                pending = {"seq": entered, "op": "all_reduce", "bytes": 1 << 26, "waited_s": waited}
        col: dict[str, Any] = {
            "group": f"col{column}",
            "axis": "dp",
            "tier": "inter_node",
            "size": self.columns,
            "entered_seq": entered,
            "completed_seq": entered - (1 if pending else 0),
        }
        if pending is not None:
            col["pending"] = pending
        world = {
            "group": "0",
            "axis": "world",
            "tier": "inter_node",
            "size": self.ranks,
            "entered_seq": step,
            "completed_seq": step,
        }
        return [col, world]

    def batch(self, rank: int, now: float) -> bytes:
        """What rank `rank`'s agent sends at `now`: its steps since the last batch and progress."""
        if self.stalled(now):
            step, steps = self.stall_step, 0
        else:
            step, steps = int(now - self.start), int(BATCH_EVERY_S)
        body = batch_dict(
            job=JOB,
            rank=rank,
            world_size=self.ranks,
            host=f"pod-{rank}",
            node=f"node{rank // self.per}",
            reports=[report_dict(s) for s in range(max(step - steps + 1, 0), step + 1) if steps],
            comm={
                "source": "flight_recorder",
                "durations": False,
                "status_interval_s": STATUS_EVERY_S,
                "traffic": [],
                "groups": self._groups(rank, step, now),
                "arrivals": [],
            },
        )
        return json.dumps(body, separators=(",", ":")).encode()

    def send_due(self, now: float) -> int:
        """Send every batch due by `now`; how many."""
        sent = 0
        for rank in range(self.ranks):
            if self._due[rank] > now:
                continue
            self.sidecars[rank // self.per].ingest(self.batch(rank, now))
            self._due[rank] += STATUS_EVERY_S if self.stalled(now) else BATCH_EVERY_S
            sent += 1
        return sent

    def families(self, names: tuple[str, ...] | None = None) -> Iterator[MetricFamily]:
        """Every sidecar's families (those in `names`, if given), merged by name, each series
        with its sidecar's `instance` label (what a scrape with `honor_labels: true` keeps);
        histograms left out."""
        per_sidecar = [s.families() for s in self.sidecars]
        merged: dict[str, MetricFamily] = {}
        samples: dict[str, list[Sample]] = {}
        for index, families in enumerate(per_sidecar):
            for f in families:
                if f.kind == "histogram" or (names is not None and f.name not in names):
                    continue
                merged.setdefault(f.name, f)
                samples.setdefault(f.name, []).extend(
                    Sample((*s.labels, f"sidecar{index}"), s.value) for s in f.samples
                )
        for name, f in merged.items():
            yield MetricFamily(
                name, f.kind, f.help, f.unit, (*f.label_names, "instance"), tuple(samples[name])
            )
