"""Link spec sources at the collector: exported with each (axis, tier), and an unknown spec gives
no efficiency anywhere (snapshot, summary, exported gauges)."""

from __future__ import annotations

import json
from typing import Any

from mfuscope.collector import Aggregator, StateConfig
from mfuscope.collector._series import metric_families
from mfuscope.collector._summary import summary

from tests.support.collector_fakes import FakeClock, batch_dict, report_dict


def _collective(axis: str, tier: str) -> dict[str, Any]:
    # 1e9 bytes in 0.1 s on a 2-rank all_reduce: busbw = 1e9 / 0.1 x 2(2-1)/2 = 1e10 B/s
    return {
        "op": "all_reduce",
        "axis": axis,
        "tier": tier,
        "group_size": 2,
        "bytes": 1_000_000_000,
        "count": 1,
        "seconds": 0.1,
        "overlapped_s": 0.0,
    }


def test_known_spec_has_an_efficiency_and_an_unknown_one_has_none() -> None:
    collector = Aggregator(StateConfig(window_steps=5), clock=FakeClock())
    topology = {
        "groups": [
            # dp across 2 nodes, one rank per node on 8 x NDR nodes: one NIC, 5e10 B/s (sysfs)
            {"axis": "dp", "tier": "inter_node", "size": 2, "spans_hosts": True,
             "link_peak_bytes_per_s": 5e10, "link_peak_source": "sysfs"},
            # tp on a CPU run: no spec at all
            {"axis": "tp", "tier": "intra_node", "size": 2, "spans_hosts": False,
             "link_peak_source": "unknown"},
        ]
    }  # fmt: skip
    collectives = [_collective("dp", "inter_node"), _collective("tp", "intra_node")]
    batch = batch_dict(rank=0, reports=[report_dict(1, collectives=collectives)], topology=topology)
    collector.ingest(json.dumps(batch).encode())
    snapshot = collector.snapshot()
    (job,) = snapshot.jobs
    assert job.tier_spec_sources == (
        ("dp", "inter_node", "sysfs"),
        ("tp", "intra_node", "unknown"),
    )
    efficiency = {(a, t): e for a, t, _, e in job.latest.tier_busbw}
    # 1e10 / 5e10 = 0.2 where the spec is known; None (not a number) where it is unknown
    assert efficiency == {("dp", "inter_node"): 0.2, ("tp", "intra_node"): None}
    tiers = {(t["axis"], t["tier"]): t for t in summary(snapshot)["jobs"][0]["tiers"]}
    assert tiers[("tp", "intra_node")]["peak_bytes_per_s"] is None
    assert tiers[("tp", "intra_node")]["efficiency"] is None
    assert tiers[("tp", "intra_node")]["peak_sources"] == ["unknown"]
    families = {f.name: f for f in metric_families(snapshot)}
    info = families["mfuscope_tier_peak_info"]
    assert [s.labels for s in info.samples] == [
        ("job-a", "dp", "inter_node", "sysfs"),
        ("job-a", "tp", "intra_node", "unknown"),
    ]
    peaks = families["mfuscope_tier_peak_bandwidth_bytes_per_second"].samples
    assert [s.labels for s in peaks] == [("job-a", "dp", "inter_node")]
    ratios = families["mfuscope_collective_bus_bandwidth_ratio"].samples
    assert [(s.labels, s.value) for s in ratios] == [(("job-a", "dp", "inter_node"), 0.2)]
