"""deploy/fleet/: what the edge sends is what the fleet dashboard reads, the OpenTelemetry
Collector pipeline goes from OTLP to remote write, and the stores' endpoints agree."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[3]
FLEET = ROOT / "deploy" / "fleet"
SERIES = re.compile(r"\b(?:[a-z_]+:mfuscope_[a-z0-9_]+:[a-z0-9_]+|mfuscope_[a-z0-9_]+|ALERTS)\b")


def _yaml(name: str) -> Any:
    return yaml.safe_load((FLEET / name).read_text(encoding="utf-8"))


def _fleet_dashboard_series() -> set[str]:
    text = (ROOT / "dashboards" / "mfuscope-fleet.json").read_text(encoding="utf-8")
    exprs = re.findall(r'"(?:expr|query)": "((?:[^"\\]|\\.)*)"', text)
    return {name for e in exprs for name in SERIES.findall(json.loads(f'"{e}"'))}


def test_the_edge_sends_every_series_the_fleet_dashboard_reads_and_no_raw_counter() -> None:
    (remote,) = _yaml("edge-prometheus.yml")["remote_write"]
    (keep,) = [r for r in remote["write_relabel_configs"] if r["action"] == "keep"]
    assert keep["source_labels"] == ["__name__"]
    kept = re.compile(f"^(?:{keep['regex']})$")  # Prometheus anchors relabel regexes
    needed = _fleet_dashboard_series()
    assert {"job:mfuscope_mfu:ratio_rate5m", "mfuscope_ranks", "ALERTS"} <= needed
    assert [n for n in needed if not kept.match(n)] == []
    # The bulk of the raw series stays in the cluster.
    for raw in ("mfuscope_step_component_seconds_total", "mfuscope_model_flops_total", "up"):
        assert not kept.match(raw), raw
    assert kept.match("instance:mfuscope_own_step_seconds:ratio_to_median_rate5m")


def test_every_edge_labels_its_cluster_and_keeps_the_training_job() -> None:
    for name in ("edge-prometheus.yml", "edge-agent.yml"):
        config = _yaml(name)
        assert "cluster" in config["global"]["external_labels"], name
        (scrape,) = config["scrape_configs"]
        assert scrape["honor_labels"] is True, name
        assert any(r.get("target_label") == "host" for r in scrape["relabel_configs"]), name


def test_the_otel_collector_pipeline_goes_from_otlp_to_remote_write() -> None:
    config = _yaml("otel-collector.yml")
    (pipeline,) = config["service"]["pipelines"].values()
    assert pipeline["receivers"] == ["otlp"]
    assert pipeline["exporters"] == ["prometheusremotewrite"]
    assert set(pipeline["processors"]) <= set(config["processors"])
    exporter = config["exporters"]["prometheusremotewrite"]
    assert exporter["endpoint"].endswith("/api/v1/write")
    assert exporter["add_metric_suffixes"] is True  # counters get their _total back
    assert "4318" in config["receivers"]["otlp"]["protocols"]["http"]["endpoint"]


def test_thanos_hashring_and_mimir_config_are_well_formed() -> None:
    (ring,) = json.loads((FLEET / "thanos-hashrings.json").read_text(encoding="utf-8"))
    assert ring["endpoints"]
    mimir = _yaml("mimir.yml")
    assert mimir["server"]["http_listen_port"] == 9009
    assert mimir["limits"]["max_global_series_per_user"] > 0


def test_the_victoriametrics_edge_scrapes_and_forwards_as_the_prometheus_agent_does() -> None:
    """vmagent's files (deploy/fleet/victoriametrics/) are edge-agent.yml's scrape job and
    keep-list, so the rules and both dashboards find the same series on either central store."""
    agent = _yaml("edge-agent.yml")
    vmagent = _yaml("victoriametrics/vmagent-scrape.yml")
    assert vmagent["scrape_configs"] == agent["scrape_configs"]
    assert vmagent["global"]["scrape_interval"] == agent["global"]["scrape_interval"]
    (agent_keep,) = agent["remote_write"][0]["write_relabel_configs"]
    (vmagent_keep,) = _yaml("victoriametrics/vmagent-remote-write.yml")
    assert vmagent_keep == agent_keep
    kept = re.compile(f"^(?:{vmagent_keep['regex']})$")
    raw = {n for n in _fleet_dashboard_series() if n.startswith("mfuscope_")}
    assert raw and all(kept.match(n) for n in raw | {"up"})
    assert not kept.match("go_goroutines")
