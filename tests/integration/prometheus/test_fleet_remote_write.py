"""Edge to central for real: a collector fed a 2-rank job, the shipped edge Prometheus
(deploy/fleet/edge-prometheus.yml) scraping it, evaluating the rules and remote-writing its
keep-list to a central Prometheus started with its remote-write receiver; every fleet-dashboard
query runs on the central one, and the fleet panels return the job with its `cluster`."""

from __future__ import annotations

import json
import threading
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.integration.prometheus.conftest import RULE_FILES
from tests.support.collector_fakes import batch_dict
from tests.support.processes import stop as stop_process

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[3]
FLEET = ROOT / "deploy" / "fleet"
JOB = "fleet-e2e"
# The Fleet dashboard's panels that must return the job (the rest need hours of history or alerts).
FLEET_PANELS = {"Fleet MFU (5 min)", "MFU per job", "HFU per job", "MFU per job now"}


def _edge_config(collector: str, central_url: str) -> dict[str, Any]:
    """The shipped edge configuration, pointed at `collector` and `central_url`, rules by absolute
    path, everything every second."""
    config: dict[str, Any] = yaml.safe_load((FLEET / "edge-prometheus.yml").read_text())
    config["global"] |= {"scrape_interval": "1s", "evaluation_interval": "1s"}
    config["rule_files"] = [str((FLEET / f).resolve()) for f in config["rule_files"]]
    assert sorted(config["rule_files"]) == sorted(str(p.resolve()) for p in RULE_FILES)
    (scrape,) = config["scrape_configs"]
    scrape["static_configs"] = [{"targets": [collector]}]
    (remote,) = config["remote_write"]
    remote["url"] = f"{central_url}/api/v1/write"
    remote["queue_config"] |= {"batch_send_deadline": "1s"}
    return config


def _feed(collector_url: str, stop: threading.Event) -> None:
    """Two ranks reporting two steps each every 0.5 s, so the counters grow across scrapes."""
    step = 1
    while not stop.is_set():
        for rank in (0, 1):
            body = json.dumps(batch_dict(job=JOB, rank=rank, steps=range(step, step + 2)))
            request = urllib.request.Request(
                f"{collector_url}/v1/reports",
                data=body.encode(),
                headers={"Content-Type": "application/json"},
            )
            with urllib.request.urlopen(request, timeout=10) as response:
                assert json.loads(response.read())["accepted"] == 2
        step += 2
        stop.wait(0.5)


def test_the_fleet_dashboard_reads_an_edge_remote_written_job_on_the_central_prometheus(
    collector: Any,
    start_prometheus: Callable[..., Any],
    dashboard_and_rule_promql: Callable[[str], list[Any]],
    wait_until: Callable[..., None],
) -> None:
    central = start_prometheus(
        [],
        config=yaml.safe_load((FLEET / "central-prometheus.yml").read_text()),
        flags=("--web.enable-remote-write-receiver",),
    )
    edge = start_prometheus([], config=_edge_config(collector.address, central.url))

    stop = threading.Event()
    feeder = threading.Thread(target=_feed, args=(collector.url, stop), daemon=True)
    feeder.start()
    try:
        mfu = f'job:mfuscope_mfu:ratio_rate5m{{job="{JOB}"}}'
        wait_until(lambda: bool(central.samples(mfu)), 45, f"{mfu} on the central Prometheus")
        (sample,) = central.samples(mfu)
        assert sample["metric"]["cluster"] == "cluster-a"  # the edge's external label
        assert 0 < float(sample["value"][1]) <= 1

        sources = dashboard_and_rule_promql(JOB)
        sources = [s for s in sources if s.origin.startswith("mfuscope-fleet /")]
        errors, answered = [], set()
        for source in sources:
            response = central.query(source.expr)
            if response["status"] != "success":
                errors.append((source.origin, response.get("error")))
            elif response["data"]["result"]:
                answered.add(source.origin.split(" / ")[1])
        assert not errors, errors
        assert answered >= FLEET_PANELS, FLEET_PANELS - answered
        assert "$job" in answered  # the job picker lists the job

        # The keep-list held: the raw per-rank counters stayed at the edge.
        assert edge.samples(f'mfuscope_model_flops_total{{job="{JOB}"}}')
        assert not central.samples(f'mfuscope_model_flops_total{{job="{JOB}"}}')
        assert {s["metric"]["job"] for s in central.samples("up")} <= {"prometheus"}
    finally:
        stop.set()
        feeder.join(timeout=10)
        # The edge first, while the central one still takes its last remote write: stopped after
        # it, the edge retries its queue until killed (10 s).
        stop_process(edge.process)
