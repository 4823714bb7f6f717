"""The services `mfuscope demo` runs beside the job: the collector and, optionally, Prometheus."""

from __future__ import annotations

import shutil
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mfuscope.cli.demo import _interrupt
from mfuscope.cli.demo._procs import Child, Supervisor
from mfuscope.core.errors import MfuscopeError

__all__ = [
    "ServiceError",
    "http_get",
    "project_prometheus_dir",
    "prometheus_config",
    "start_collector",
    "start_prometheus",
]

# Loopback only, never through an HTTP proxy from the environment.
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))
READY_TIMEOUT_S = 20.0
DEMO_SCRAPE_INTERVAL = "5s"  # a one-minute demo needs more than the production 15 s scrapes


class ServiceError(MfuscopeError, RuntimeError):
    """A service that did not come up; the message says why and where its log is."""


def http_get(url: str, timeout_s: float = 1.0) -> bytes | None:
    """The body of a 200 response, or None (refused, timed out, other status)."""
    try:
        with _OPENER.open(url, timeout=timeout_s) as response:
            body: bytes = response.read()
            return body if response.status == 200 else None
    except (OSError, urllib.error.URLError, ValueError):
        return None


def _tail(path: Path, lines: int = 15) -> str:
    try:
        text = path.read_text(errors="replace").splitlines()
    except OSError:
        return ""
    return "\n".join(text[-lines:])


def _wait(child: Child, ready: Callable[[], bool], what: str, log: Path, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not ready():
        _interrupt.check()
        if not child.running():
            raise ServiceError(f"{what} exited with code {child.popen.returncode}:\n{_tail(log)}")
        if time.monotonic() > deadline:
            raise ServiceError(f"{what} not ready after {timeout_s:.0f} s (log: {log})")
        time.sleep(0.1)


@dataclass(frozen=True)
class CollectorProcess:
    child: Child
    address: str  # HOST:PORT it listens on

    @property
    def url(self) -> str:
        return f"http://{self.address}"


def start_collector(
    supervisor: Supervisor, listen: str, tmp: Path, log: Path, env: Mapping[str, str]
) -> CollectorProcess:
    """Start `mfuscope collector` on `listen` and wait until /healthz answers."""
    address_file = tmp / "collector.address"
    argv = [
        sys.executable, "-m", "mfuscope.cli", "collector",
        "--listen", listen,
        "--address-file", str(address_file),
        "--per-rank-labels",  # a 2-rank demo: per-rank series are cheap and instructive
        "--expire-after", "3600",
    ]  # fmt: skip
    child = supervisor.start("collector", argv, env, log)
    address: list[str] = []

    def ready() -> bool:
        if not address:
            text = address_file.read_text().strip() if address_file.exists() else ""
            if not text:
                return False
            address.append(text)
        return http_get(f"http://{address[0]}/healthz") is not None

    try:
        _wait(child, ready, "the collector", log, READY_TIMEOUT_S)
    except ServiceError:
        supervisor.stop(child)
        raise
    return CollectorProcess(child, address[0])


def project_prometheus_dir() -> Path:
    """The project's `deploy/prometheus` (scrape config and rules) as installed: the wheel ships
    it in the data-only namespace package `mfuscope.deploy`, which an editable install maps onto
    the checkout's `deploy/`. Its `__path__` is searched, not `importlib.resources`: an editable
    install puts a non-folder hook entry in a namespace package's path, which resources refuse."""
    import importlib

    try:
        entries = list(getattr(importlib.import_module("mfuscope.deploy"), "__path__", []))
    except ModuleNotFoundError:
        entries = []
    for entry in entries:
        candidate = Path(entry) / "prometheus"
        if candidate.is_dir():
            return candidate
    raise ServiceError(f"no prometheus/ folder in mfuscope.deploy ({entries}): a broken install")


def prometheus_config(project: Mapping[str, Any], config_dir: Path, target: str) -> dict[str, Any]:
    """The project's Prometheus config pointed at `target`, rule files made absolute (pure).

    Every scrape job whose name contains ``mfuscope`` scrapes `target` only; intervals shrink to
    `DEMO_SCRAPE_INTERVAL` so rates exist within the demo's minute. Everything else (recording
    and alert rules, ``honor_labels``) stays the project's.
    """
    config = dict(project)
    config["global"] = {
        **dict(project.get("global") or {}),
        "scrape_interval": DEMO_SCRAPE_INTERVAL,
        "evaluation_interval": DEMO_SCRAPE_INTERVAL,
    }
    config["rule_files"] = [str(config_dir / r) for r in project.get("rule_files") or []]
    jobs = [
        {**job, "static_configs": [{"targets": [target]}]}
        for job in project.get("scrape_configs") or []
        if "mfuscope" in str(job.get("job_name", "")) and "static_configs" in job
    ]
    if not jobs:
        raise ServiceError("the project's prometheus.yml has no static mfuscope scrape job")
    config["scrape_configs"] = jobs
    return config


def start_prometheus(
    supervisor: Supervisor, listen: str, target: str, tmp: Path, log: Path, env: Mapping[str, str]
) -> str:
    """Start Prometheus with the project's rules scraping `target`; returns its base URL."""
    binary = shutil.which("prometheus")
    if binary is None:
        raise ServiceError("no `prometheus` binary on PATH (./dev installs Debian's package)")
    config_dir = project_prometheus_dir()
    source = config_dir / "prometheus.yml"
    if not source.exists():
        raise ServiceError(f"{source} not found: this mfuscope installation lacks its data files")
    try:
        import yaml
    except ImportError:
        raise ServiceError("--prometheus needs PyYAML (pip install pyyaml)") from None
    config = prometheus_config(yaml.safe_load(source.read_text()), config_dir, target)
    config_path = tmp / "prometheus.yml"
    config_path.write_text(yaml.safe_dump(config, sort_keys=False))
    argv = [
        binary,
        f"--config.file={config_path}",
        f"--storage.tsdb.path={tmp / 'prometheus-data'}",
        f"--web.listen-address={listen}",
        "--log.level=warn",
    ]
    child = supervisor.start("prometheus", argv, env, log)
    url = f"http://{listen}"
    try:
        _wait(child, lambda: http_get(f"{url}/-/ready") is not None, "Prometheus", log, 15.0)
    except ServiceError:
        supervisor.stop(child)
        raise
    return url
