"""Deployment files: every manifest parses, and the references between them hold.

Kubernetes (sidecar and DaemonSet variants), docker compose, and the collector image recipe.
Docker and Kubernetes do not run here; these checks are what can be verified without them,
including that the collector and agent accept the flags and variables the manifests pass.
"""

from __future__ import annotations

import argparse
import dataclasses
import re
import shlex
from pathlib import Path, PurePosixPath
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[3]
DEPLOY = ROOT / "deploy"
K8S = DEPLOY / "kubernetes"
COMPOSE = DEPLOY / "compose"
DOCKERFILE = DEPLOY / "image" / "Dockerfile"
YAML_FILES = sorted([*DEPLOY.rglob("*.yml"), *DEPLOY.rglob("*.yaml")])

Doc = dict[str, Any]


def _docs(path: Path) -> list[Doc]:
    return [d for d in yaml.safe_load_all(path.read_text(encoding="utf-8")) if d is not None]


def _one(path: Path, kind: str) -> Doc:
    docs = [d for d in _docs(path) if d.get("kind") == kind]
    assert len(docs) == 1, f"{path.name}: expected one {kind}"
    return docs[0]


def _pod_spec(workload: Doc) -> Doc:
    spec: Doc = workload["spec"]["template"]["spec"]
    return spec


def _pod_labels(workload: Doc) -> dict[str, str]:
    labels: dict[str, str] = workload["spec"]["template"]["metadata"]["labels"]
    return labels


def _containers(workload: Doc) -> list[Doc]:
    spec = _pod_spec(workload)
    return [*spec.get("initContainers", []), *spec["containers"]]


def _collector(workload: Doc) -> Doc:
    found = [c for c in _containers(workload) if "collector" in c["name"]]
    assert len(found) == 1, "exactly one collector container"
    return found[0]


def _arg(container: Doc, flag: str) -> str:
    args: list[str] = container["args"]
    return args[args.index(flag) + 1]


def _env(container: Doc) -> dict[str, Doc]:
    return {e["name"]: e for e in container.get("env", [])}


def _matches(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in selector.items())


def _collector_parser() -> argparse.ArgumentParser:
    from mfuscope.cli import run_collector as collector

    parser = argparse.ArgumentParser()
    collector.add_arguments(parser)
    return parser


def _agent_env_names() -> set[str]:
    from mfuscope.agent.config import AgentConfig
    from mfuscope.core.settings import ENV_PREFIX

    return {ENV_PREFIX + f.name.upper() for f in dataclasses.fields(AgentConfig)}


@pytest.mark.parametrize("path", YAML_FILES, ids=lambda p: str(p.relative_to(DEPLOY)))
def test_every_yaml_file_parses(path: Path) -> None:
    docs = _docs(path)
    assert docs
    if path.is_relative_to(K8S) and path.name != "prometheus-scrape-config.yml":
        for doc in docs:
            assert doc["apiVersion"] and doc["kind"] and doc["metadata"]["name"], path


VARIANTS = {
    "sidecar": (K8S / "sidecar" / "training-job.yaml", "Job"),
    "daemonset": (K8S / "daemonset" / "collector-daemonset.yaml", "DaemonSet"),
}


@pytest.mark.parametrize("variant", VARIANTS)
def test_collector_container_is_locked_down_and_probed(variant: str) -> None:
    path, kind = VARIANTS[variant]
    workload = _one(path, kind)
    collector = _collector(workload)
    port = {p["name"]: p["containerPort"] for p in collector["ports"]}["mfuscope"]
    # The collector accepts the arguments, and listens where the container port says.
    args = _collector_parser().parse_args(collector["args"])
    assert args.listen == f"0.0.0.0:{port}"
    assert args.token_file, "listening beyond loopback requires a token"
    token_dir = PurePosixPath(args.token_file).parent
    mounts = {PurePosixPath(m["mountPath"]): m for m in collector["volumeMounts"]}
    assert token_dir in mounts and mounts[token_dir]["readOnly"] is True
    volumes = {v["name"]: v for v in _pod_spec(workload)["volumes"]}
    assert volumes[mounts[token_dir]["name"]]["secret"]["secretName"] == "mfuscope-token"
    # Probes hit /healthz on the collector's port.
    probes = [
        collector[p] for p in ("readinessProbe", "livenessProbe", "startupProbe") if p in collector
    ]
    assert len(probes) >= 2
    for probe in probes:
        assert probe["httpGet"]["path"] == "/healthz"
        assert probe["httpGet"]["port"] in ("mfuscope", port)
    # Non-root, read-only root filesystem, no privilege escalation, no capabilities.
    pod_security = _pod_spec(workload).get("securityContext", {})
    security = {**pod_security, **collector["securityContext"]}
    assert security["runAsNonRoot"] is True and security.get("runAsUser", 0) != 0
    assert security["readOnlyRootFilesystem"] is True
    assert security["allowPrivilegeEscalation"] is False
    assert security["capabilities"]["drop"] == ["ALL"]
    assert security["seccompProfile"]["type"] == "RuntimeDefault"
    resources = collector["resources"]
    assert set(resources) == {"requests", "limits"}
    assert {"cpu", "memory"} <= set(resources["requests"]) and {"cpu", "memory"} <= set(
        resources["limits"]
    )
    # Plain-Prometheus scrape annotations agree with the port.
    annotations = workload["spec"]["template"]["metadata"]["annotations"]
    assert annotations["prometheus.io/scrape"] == "true"
    assert annotations["prometheus.io/port"] == str(port)
    assert annotations["prometheus.io/path"] == "/metrics"


def test_sidecar_runs_as_a_native_sidecar_beside_the_trainer() -> None:
    job = _one(VARIANTS["sidecar"][0], "Job")
    spec = _pod_spec(job)
    (sidecar,) = spec["initContainers"]
    assert sidecar["restartPolicy"] == "Always", "a plain init container would block the trainer"
    assert spec["restartPolicy"] == "Never"
    trainers = spec["containers"]
    assert len(trainers) == 1


@pytest.mark.parametrize(
    ("job_path", "expected_host"),
    [
        (K8S / "sidecar" / "training-job.yaml", "127.0.0.1"),
        (K8S / "daemonset" / "training-job.yaml", "mfuscope-collector"),
    ],
    ids=["sidecar", "daemonset"],
)
def test_trainer_reports_to_the_collector_with_the_shared_token(
    job_path: Path, expected_host: str
) -> None:
    job = _one(job_path, "Job")
    (trainer,) = _pod_spec(job)["containers"]
    env = _env(trainer)
    assert set(env) <= _agent_env_names(), "the agent reads MFUSCOPE_<config field>"
    url = urlsplit(env["MFUSCOPE_COLLECTOR_URL"]["value"])
    assert url.hostname == expected_host and url.port == 9464
    assert env["MFUSCOPE_JOB"]["value"] == job["metadata"]["name"]
    secret = env["MFUSCOPE_TOKEN"]["valueFrom"]["secretKeyRef"]
    assert secret == {"name": "mfuscope-token", "key": "token"}
    # Tiers by node, not by pod name: the node from the downward API.
    assert env["MFUSCOPE_NODE_NAME"]["valueFrom"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}
    if expected_host != "127.0.0.1":
        service = _one(K8S / "daemonset" / "service.yaml", "Service")
        assert service["metadata"]["name"] == expected_host
        assert url.port in [p["port"] for p in service["spec"]["ports"]]


def test_sidecar_service_and_monitors_select_the_training_pods() -> None:
    job = _one(K8S / "sidecar" / "training-job.yaml", "Job")
    labels = _pod_labels(job)
    port_names = {p["name"] for c in _containers(job) for p in c.get("ports", [])}
    service = _one(K8S / "sidecar" / "service.yaml", "Service")
    assert _matches(service["spec"]["selector"], labels)
    assert "mfuscope" in service["metadata"]["name"], "the Operator names the scrape job after it"
    (service_port,) = service["spec"]["ports"]
    assert service_port["targetPort"] in port_names
    pod_monitor = _one(K8S / "sidecar" / "podmonitor.yaml", "PodMonitor")
    assert _matches(pod_monitor["spec"]["selector"]["matchLabels"], labels)
    service_monitor = _one(K8S / "sidecar" / "servicemonitor.yaml", "ServiceMonitor")
    assert _matches(
        service_monitor["spec"]["selector"]["matchLabels"], service["metadata"]["labels"]
    )
    for endpoint in pod_monitor["spec"]["podMetricsEndpoints"]:
        assert endpoint["port"] in port_names
    for endpoint in service_monitor["spec"]["endpoints"]:
        assert endpoint["port"] == service_port["name"]
    for monitor in (pod_monitor, service_monitor):
        assert "mfuscope" in monitor["metadata"]["name"]
        for endpoint in monitor["spec"].get(
            "podMetricsEndpoints", monitor["spec"].get("endpoints")
        ):
            assert endpoint["honorLabels"] is True and endpoint["path"] == "/metrics"


def test_daemonset_service_and_monitor_select_the_collector_pods() -> None:
    daemonset = _one(K8S / "daemonset" / "collector-daemonset.yaml", "DaemonSet")
    labels = _pod_labels(daemonset)
    assert _matches(daemonset["spec"]["selector"]["matchLabels"], labels)
    port_names = {p["name"] for c in _containers(daemonset) for p in c.get("ports", [])}
    service = _one(K8S / "daemonset" / "service.yaml", "Service")
    assert _matches(service["spec"]["selector"], labels)
    assert service["spec"]["internalTrafficPolicy"] == "Local", "reports stay on the node"
    assert all(p["targetPort"] in port_names for p in service["spec"]["ports"])
    monitor = _one(K8S / "daemonset" / "podmonitor.yaml", "PodMonitor")
    assert _matches(monitor["spec"]["selector"]["matchLabels"], labels)
    assert "mfuscope" in monitor["metadata"]["name"]
    for endpoint in monitor["spec"]["podMetricsEndpoints"]:
        assert endpoint["port"] in port_names and endpoint["honorLabels"] is True
    trainer_job = _one(K8S / "daemonset" / "training-job.yaml", "Job")
    # Trainers land only where a collector runs (internalTrafficPolicy: Local has no fallback).
    assert _pod_spec(trainer_job)["nodeSelector"] == _pod_spec(daemonset)["nodeSelector"]


def test_plain_kubernetes_scrape_config_matches_the_manifests() -> None:
    (job,) = yaml.safe_load((K8S / "prometheus-scrape-config.yml").read_text())["scrape_configs"]
    keep = {
        tuple(r["source_labels"]): r["regex"]
        for r in job["relabel_configs"]
        if r.get("action") == "keep"
    }
    assert keep[("__meta_kubernetes_pod_annotation_prometheus_io_scrape",)] == "true"
    port_regex = keep[("__meta_kubernetes_pod_container_port_name",)]
    for path, kind in VARIANTS.values():
        workload = _one(path, kind)
        ports = [p["name"] for p in _collector(workload)["ports"]]
        assert any(re.fullmatch(port_regex, name) for name in ports), path


def _compose() -> Doc:
    doc: Doc = yaml.safe_load((COMPOSE / "docker-compose.yml").read_text(encoding="utf-8"))
    return doc


def _mounts(service: Doc) -> dict[PurePosixPath, Path]:
    """Container path -> host path of a compose service's bind mounts."""
    mounts = {}
    for volume in service.get("volumes", []):
        source, target = volume.split(":")[:2]
        if source.startswith("."):
            mounts[PurePosixPath(target)] = (COMPOSE / source).resolve()
    return mounts


def _host_path(mounts: dict[PurePosixPath, Path], container_path: str) -> Path:
    path = PurePosixPath(container_path)
    for target, source in mounts.items():
        if path == target or target in path.parents:
            return source / path.relative_to(target)
    raise AssertionError(f"{container_path} is not mounted from the repository")


def test_compose_stack_references_resolve() -> None:
    services = _compose()["services"]
    assert set(services) == {"collector", "prometheus", "grafana"}
    # collector: built from the image recipe, flags accepted by the collector CLI.
    build = services["collector"]["build"]
    assert (COMPOSE / build["context"] / build["dockerfile"]).resolve() == DOCKERFILE.resolve()
    args = _collector_parser().parse_args(services["collector"]["command"])
    collector_port = int(args.listen.rsplit(":", 1)[1])
    (secret,) = services["collector"]["secrets"]
    assert args.token_file == f"/run/secrets/{secret}"
    assert services["collector"]["read_only"] is True
    assert not services["collector"]["user"].startswith("0")
    # Every bind mount exists.
    for service in services.values():
        for host in _mounts(service).values():
            assert host.exists(), host
    # prometheus: the config it loads scrapes the collector and loads exactly the project rules.
    prometheus = services["prometheus"]
    prom_mounts = _mounts(prometheus)
    config_path = _host_path(prom_mounts, "/etc/prometheus/prometheus.yml")
    assert (
        f"--config.file={PurePosixPath('/etc/prometheus/prometheus.yml')}" in prometheus["command"]
    )
    config = yaml.safe_load(config_path.read_text(encoding="utf-8"))
    rule_files = sorted(_host_path(prom_mounts, f).resolve() for f in config["rule_files"])
    assert rule_files == sorted((DEPLOY / "prometheus" / "rules").resolve().glob("*.yml"))
    targets = config["scrape_configs"][0]["static_configs"][0]["targets"]
    assert targets == [f"collector:{collector_port}"]
    # grafana: provisioning mounted; the data source points at the prometheus service; the
    # dashboard provider's folder is the repository's dashboards/ with the three dashboards.
    grafana_mounts = _mounts(services["grafana"])
    provisioning = _host_path(grafana_mounts, "/etc/grafana/provisioning")
    (datasource,) = yaml.safe_load(
        (provisioning / "datasources" / "prometheus.yml").read_text(encoding="utf-8")
    )["datasources"]
    assert datasource["type"] == "prometheus" and datasource["isDefault"] is True
    assert datasource["url"] == "http://prometheus:9090"
    (provider,) = yaml.safe_load(
        (provisioning / "dashboards" / "mfuscope.yml").read_text(encoding="utf-8")
    )["providers"]
    dashboards = _host_path(grafana_mounts, provider["options"]["path"])
    assert dashboards == (ROOT / "dashboards").resolve()
    assert {p.name for p in dashboards.glob("*.json")} == {
        "mfuscope-fleet.json",
        "mfuscope-job.json",
        "mfuscope-communication.json",
    }
    # The token file is never committed.
    assert COMPOSE.joinpath(_compose()["secrets"][secret]["file"]).name in (
        (COMPOSE / ".gitignore").read_text(encoding="utf-8").split()
    )


def _dockerfile_instructions() -> list[tuple[str, str]]:
    text = DOCKERFILE.read_text(encoding="utf-8")
    text = re.sub(r"\\\n", " ", text)  # join continuation lines
    instructions = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            keyword, _, rest = line.partition(" ")
            instructions.append((keyword.upper(), rest.strip()))
    return instructions


def test_collector_image_installs_no_torch() -> None:
    instructions = _dockerfile_instructions()
    runs = [rest for keyword, rest in instructions if keyword == "RUN"]
    installs = [c.strip() for r in runs for c in r.split("&&") if c.split()[:1] == ["pip"]]
    assert installs, "the recipe installs the package with pip"
    for command in installs:
        words = shlex.split(command)
        assert not any("torch" in w or "nvidia" in w for w in words), command
        assert not any("[" in w for w in words), f"no extras: {command}"
    # The final stage checks it, too.
    assert any("find_spec('torch') is not None" in r for r in runs)
    # The image installs the wheel users install (built into dist/ first), never its own build
    # of the source tree.
    copies = [rest.split() for keyword, rest in instructions if keyword == "COPY"]
    assert copies == [["dist/mfuscope-*.whl", "/wheels/"]]
    assert not any(keyword == "FROM" and " AS " in rest.upper() for keyword, rest in instructions)


def test_collector_image_runs_the_collector_as_non_root() -> None:
    instructions = dict(_dockerfile_instructions()[::-1])  # the last of each keyword wins
    user = instructions["USER"].split(":")[0]
    assert user.isdigit() and int(user) != 0
    assert yaml.safe_load(instructions["ENTRYPOINT"]) == ["mfuscope", "collector"]
    assert instructions["EXPOSE"] == "9464"
    _collector_parser().parse_args(yaml.safe_load(instructions["CMD"]))
    assert "/healthz" in instructions["HEALTHCHECK"]


# Top-level modules of the optional extras (agent, report, dev): absent from the image.
# (numpy and isal are base dependencies: the analysis core uses them.)
_NOT_IN_IMAGE = (
    "torch",
    "pynvml",
    "matplotlib",
    "rich",
    "pytest",
    "hypothesis",
    "jsonschema",
    "yaml",
    "grafana_foundation_sdk",
)
_WITHOUT_EXTRAS = f"""
import importlib.abc, sys

class Absent(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name.split(".")[0] in {_NOT_IN_IMAGE!r}:
            raise ModuleNotFoundError(f"not in the collector image: {{name}}")
        return None

sys.meta_path.insert(0, Absent())
for name in {_NOT_IN_IMAGE!r}:
    sys.modules.pop(name, None)
import mfuscope.collector.app, mfuscope.collector._server, mfuscope.exporters.otlp
from mfuscope.cli import main
try:
    main(["collector", "--help"])
except SystemExit as exit:
    sys.exit(exit.code)
"""


@pytest.mark.slow  # a fresh virtualenv and the collector command
def test_collector_command_works_with_only_the_base_dependencies(tmp_path: Path) -> None:
    """What the image has (the package without extras) is enough for `mfuscope collector`."""
    import subprocess
    import sys

    result = subprocess.run(
        [sys.executable, "-c", _WITHOUT_EXTRAS], capture_output=True, text=True, cwd=tmp_path
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "--listen" in result.stdout and "--token-file" in result.stdout
