"""Record report-batch bodies as the agents of each schema version wrote them.

Run once per version, with that version's `mfuscope.core` first on the path (exported from the
commit that last spoke it: ``git archive <commit> core``), e.g.::

    mkdir -p /tmp/old/mfuscope && git archive aa79cac^ core | tar -x -C /tmp/old/mfuscope
    touch /tmp/old/mfuscope/__init__.py
    PYTHONPATH=/tmp/old python tests/data/wire/record_bodies.py tests/data/wire

It builds one batch with every field that version has and writes ``batch-<version>.json``: the
bytes that version's encoder (`batch_to_json`, what its agent sent) produced.
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path
from typing import Any

from mfuscope.core import schema as s


def _make(cls: Any, **values: Any) -> Any:
    """`cls(**values)`, keeping only the fields this version's record has."""
    names = {f.name for f in dataclasses.fields(cls)}
    return cls(**{k: v for k, v in values.items() if k in names})


def _batch() -> Any:
    comm = None
    if hasattr(s, "CommRecords"):
        from mfuscope.core import collective_records as c

        comm = c.CommRecords(
            source="flight_recorder",
            durations=True,
            status_interval_s=10.0,
            lost_total=3,
            p2p_recorded=True,
            traffic=(
                c.CollectiveTraffic(
                    "all_reduce",
                    "dp",
                    "inter_node",
                    16,
                    4812,
                    504658329600,
                    12.5,
                    12.0,
                    504000000000,
                ),
                c.CollectiveTraffic("all_gather", "tp", "intra_node", None, 9000, 1 << 33),
            ),
            groups=(
                c.GroupProgress(
                    "3",
                    "dp",
                    "inter_node",
                    16,
                    4812,
                    4811,
                    c.PendingCollective(4812, "all_reduce", 104857600, 94.25),
                ),
                c.GroupProgress("0", "tp", "intra_node", 8, 9000, 9000),
            ),
            arrivals=(
                c.ArrivalSample("3", 4790, 1763700000000000000),
                c.ArrivalSample("0", 8990, 1763700000000123456),
            ),
        )
    hardware = None
    if hasattr(s, "HardwareCounters"):
        hardware = s.HardwareCounters(
            memory_busy_ratio=0.41,
            sm_clock_ratio=0.93,
            power_watts=655.0,
            energy_joules_total=81234.5,
            links=(s.LinkBytes("nvlink", "tx", 912345678), s.LinkBytes("ib", "rx", 1 << 40)),
            link_peaks=(s.LinkPeak("nvlink", 4.5e11),),
            throttle=(s.ThrottleTime("sw_power_cap", 12.0),),
        )
    classes = ()
    if hasattr(s, "ClassShare"):
        classes = (s.ClassShare("gemm", 0.5), s.ClassShare("elementwise_norm_reduce", 0.1))
    reports = (
        _make(
            s.StepReport,
            step=120,
            start_unix_ns=1763700000000000000,
            wall_s=0.81,
            model_flops=3.1e14,
            recompute_flops=4.0e13,
            components=(
                s.ComponentShare("compute", 0.6),
                s.ComponentShare("exposed_comm", 0.21, "dp", "inter_node"),
            ),
            overlapped_comm_s=0.3,
            breakdown_step=100,
            collectives=(
                s.CollectiveSample("all_reduce", "dp", "inter_node", 16, 104857600, 4, 0.5, 0.3),
                s.CollectiveSample("send", "pp", "inter_node", 2, None, 1, 0.0, 0.0),
            ),
            compute_classes=classes,
        ),
        _make(
            s.StepReport,
            step=121,
            start_unix_ns=1763700000810000000,
            wall_s=0.8,
            model_flops=3.1e14,
            recompute_flops=0.0,
        ),
    )
    topology = s.Topology(
        groups=(
            _make(
                s.GroupInfo,
                axis="tp",
                tier="intra_node",
                size=8,
                spans_hosts=False,
                link_peak_bytes_per_s=4.5e11,
                link_peak_source="nvml",
            ),
            _make(
                s.GroupInfo,
                axis="dp",
                tier="inter_node",
                size=16,
                spans_hosts=True,
                link_peak_source="unknown",
            ),
        )
    )
    if s.SCHEMA_VERSION == "1.0":  # no source yet: a group without a rate is just unknown
        topology = s.Topology(
            groups=(topology.groups[0], s.GroupInfo("dp", "inter_node", 16, True))
        )
    return _make(
        s.ReportBatch,
        job="llama-8b",
        rank=3,
        world_size=16,
        local_rank=3,
        host="node-1-pod",
        node="node-1",
        device="NVIDIA H100 80GB HBM3",
        peak_flops=9.89e14,
        peak_source="spec",
        sent_unix_ns=1763700001000000000,
        reports=reports,
        health=s.AgentHealth(
            reports_dropped_total=2,
            send_failures_total=1,
            profiler_failures_total=0,
            windows_analysed_total=5,
        ),
        topology=topology,
        incarnation="5f0c9a1e2b7d4c38",
        hardware=hardware,
        comm=comm,
        closing=False,
    )


def main(out: Path) -> None:
    path = out / f"batch-{s.SCHEMA_VERSION}.json"
    # The encoder of the version on the path: `batch_to_json` until 1.3, `encode_batch` after.
    encode = getattr(s, "batch_to_json", None) or (lambda batch: s.encode_batch(batch).decode())
    path.write_text(encode(_batch()) + "\n")
    print(path)


if __name__ == "__main__":
    main(Path(sys.argv[1]))
