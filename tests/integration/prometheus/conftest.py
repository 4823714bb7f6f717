"""Fixtures for the Prometheus tests: promtool, a real Prometheus server, a real collector, and
every PromQL expression of the dashboards and rules.

Prometheus and promtool come from the system (Debian's `prometheus` package, which `./dev`
installs); tests skip with a clear message only when the binaries are missing.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support import processes
from tests.support.processes import http_ready, spawn, stop

ROOT = Path(__file__).resolve().parents[3]
DASHBOARDS = sorted((ROOT / "dashboards").glob("*.json"))
PROMETHEUS_DIR = ROOT / "deploy" / "prometheus"
RULE_FILES = sorted((PROMETHEUS_DIR / "rules").glob("*.yml"))
BIN = Path(sys.executable).parent

# Grafana's own range variable is not PromQL (FACTS.md): it must be replaced before a query
# reaches promtool or Prometheus. 5m matches the recording rules' windows.
RATE_INTERVAL = "5m"


@dataclass(frozen=True)
class PromQLSource:
    """One PromQL expression and where it comes from.

    `origin` is e.g. ``mfuscope-job / Step decomposition / B`` or ``record job:mfuscope_mfu:...``;
    `kind` is ``panel``, ``variable``, ``record`` or ``alert``; for a `variable`, `label` is the
    label whose values the variable lists.
    """

    origin: str
    kind: str
    expr: str
    label: str | None = None


def substitute(expr: str, job: str) -> str:
    """A dashboard expression with Grafana's variables replaced by values Prometheus accepts.

    `job` is used as is inside `=~"..."`, so it must be free of regex metacharacters (Grafana
    would escape them; our test jobs have plain names)."""
    assert re.fullmatch(r"[A-Za-z0-9_-]+", job), job
    values = {
        "__rate_interval": RATE_INTERVAL,
        "job": job,
        "axis": ".*",
        "tier": ".*",
    }
    out = expr
    for name, value in values.items():
        out = out.replace("${" + name + "}", value).replace("$" + name, value)
    assert "$" not in out, f"unsubstituted Grafana variable in {expr!r}"
    return out


def _variable_selector(query: str) -> tuple[str, str]:
    """`label_values(<selector>, <label>)` -> (selector, label)."""
    match = re.fullmatch(r"label_values\((.+),\s*([a-zA-Z_][a-zA-Z0-9_]*)\)", query.strip())
    assert match, f"unsupported variable query {query!r}"
    return match.group(1), match.group(2)


def promql_sources(job: str) -> list[PromQLSource]:
    """Every PromQL expression in the dashboards (panel targets and variable queries, with the
    Grafana variables substituted for `job`) and in the rule files (records and alerts)."""
    sources = []
    for path in DASHBOARDS:
        dashboard = json.loads(path.read_text(encoding="utf-8"))
        for variable in dashboard["templating"]["list"]:
            if variable["type"] != "query":
                continue
            selector, label = _variable_selector(variable["query"])
            sources.append(
                PromQLSource(
                    f"{path.stem} / ${variable['name']}",
                    "variable",
                    substitute(selector, job),
                    label,
                )
            )
        for panel in dashboard["panels"]:
            for target in panel.get("targets", []):
                sources.append(
                    PromQLSource(
                        f"{path.stem} / {panel['title']} / {target['refId']}",
                        "panel",
                        substitute(target["expr"], job),
                    )
                )
    for path in RULE_FILES:
        for group in yaml.safe_load(path.read_text(encoding="utf-8"))["groups"]:
            for rule in group["rules"]:
                kind = "record" if "record" in rule else "alert"
                sources.append(PromQLSource(f"{kind} {rule[kind]}", kind, rule["expr"]))
    return sources


def _binary(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        pytest.skip(
            f"{name} is not installed: `./dev setup` installs it (Debian package `prometheus`)"
        )
    return path


@pytest.fixture(scope="session")
def promtool() -> str:
    return _binary("promtool")


@pytest.fixture(scope="session")
def prometheus_binary() -> str:
    return _binary("prometheus")


def wait_for(
    predicate: Callable[[], bool],
    timeout_s: float,
    what: str | Callable[[], str],
    interval_s: float = 0.2,
) -> None:
    """Poll `predicate` until it holds; fail the test saying `what` did not happen (a callable
    `what` is asked at that moment, so it can say what is still missing)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(interval_s)
    description = what() if callable(what) else what
    pytest.fail(f"timed out after {timeout_s:.0f} s waiting for {description}")


class PrometheusServer:
    """A real Prometheus on 127.0.0.1 with the project's rules, and a client for its HTTP API."""

    def __init__(self, url: str, process: subprocess.Popen[bytes], log: Path) -> None:
        self.url = url
        self.process = process
        self.log = log

    def _get(self, path: str, params: dict[str, str]) -> dict[str, Any]:
        url = f"{self.url}{path}?{urllib.parse.urlencode(params)}"
        try:
            with urllib.request.urlopen(url, timeout=10) as response:
                body: dict[str, Any] = json.load(response)
        except urllib.error.HTTPError as error:  # 400/422: a bad query, with a JSON body
            body = json.load(error)
        return body

    def query(self, expr: str) -> dict[str, Any]:
        """`/api/v1/query` at now; the decoded response (`status`, `data` or `error`)."""
        return self._get("/api/v1/query", {"query": expr})

    def query_range(self, expr: str, seconds: float, step_s: float = 1.0) -> dict[str, Any]:
        end = time.time()
        params = {"query": expr, "start": f"{end - seconds:.3f}", "end": f"{end:.3f}"}
        return self._get("/api/v1/query_range", {**params, "step": f"{step_s:g}"})

    def samples(self, expr: str) -> list[dict[str, Any]]:
        """The instant vector of `expr` now (fails the test on a query error)."""
        response = self.query(expr)
        assert response["status"] == "success", (expr, response)
        result: list[dict[str, Any]] = response["data"]["result"]
        return result

    def rules(self) -> list[dict[str, Any]]:
        groups: list[dict[str, Any]] = self._get("/api/v1/rules", {})["data"]["groups"]
        return [rule for group in groups for rule in group["rules"]]

    def ready(self) -> bool:
        return http_ready(f"{self.url}/-/ready")

    def wait_scraping_collector(self, timeout_s: float = 30) -> None:
        """Block until this Prometheus has scraped the collector target successfully."""
        wait_for(
            lambda: bool(self.samples('up{job="mfuscope-collector"} == 1')),
            timeout_s,
            "Prometheus to scrape the collector",
        )


def prometheus_config(
    targets: list[str],
    interval_s: int = 1,
    rule_files: list[Path] | None = None,
    alertmanagers: list[str] | None = None,
) -> dict[str, Any]:
    """The project's deploy/prometheus/prometheus.yml, pointed at `targets`, rules by absolute
    path (`rule_files` instead of the project's when given), scraping and evaluating every
    `interval_s` seconds, sending alerts to `alertmanagers` (HOST:PORT) when given."""
    config: dict[str, Any] = yaml.safe_load(
        (PROMETHEUS_DIR / "prometheus.yml").read_text(encoding="utf-8")
    )
    config["global"] = {
        "scrape_interval": f"{interval_s}s",
        "evaluation_interval": f"{interval_s}s",
    }
    config["rule_files"] = [str((PROMETHEUS_DIR / f).resolve()) for f in config["rule_files"]]
    if rule_files is not None:
        config["rule_files"] = [str(f) for f in rule_files]
    if alertmanagers:
        config["alerting"] = {"alertmanagers": [{"static_configs": [{"targets": alertmanagers}]}]}
    (job,) = [j for j in config["scrape_configs"] if j["job_name"] == "mfuscope-collector"]
    job["static_configs"] = [{"targets": targets}]
    config["scrape_configs"] = [job]
    return config


@pytest.fixture
def start_prometheus(
    prometheus_binary: str, tmp_path: Path
) -> Iterator[Callable[..., PrometheusServer]]:
    """Factory: start Prometheus scraping `targets` every second with the project's rules
    (keyword arguments as `prometheus_config`'s), or with `config` as given; `flags` are added to
    its command line. Each server has its own directory, so several can run at once."""
    servers: list[PrometheusServer] = []

    def start(
        targets: list[str],
        *,
        config: dict[str, Any] | None = None,
        flags: tuple[str, ...] = (),
        **options: Any,
    ) -> PrometheusServer:
        home = tmp_path / f"prometheus-{len(servers)}"
        home.mkdir()
        config_file = home / "prometheus.yml"
        content = config if config is not None else prometheus_config(targets, **options)
        config_file.write_text(yaml.safe_dump(content), encoding="utf-8")
        for _attempt in range(5):  # the probed free port can be taken before Prometheus binds
            port = processes.free_port()
            log = home / f"prometheus-{port}.log"
            command = [
                prometheus_binary,
                f"--config.file={config_file}",
                f"--storage.tsdb.path={home / 'tsdb'}",
                f"--web.listen-address=127.0.0.1:{port}",
                "--log.level=warn",
                *flags,
            ]
            process = spawn(command, log)
            server = PrometheusServer(f"http://127.0.0.1:{port}", process, log)
            servers.append(server)
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline and process.poll() is None and not server.ready():
                time.sleep(0.1)
            if server.ready():
                return server
            stop(process)
        pytest.fail(f"Prometheus did not start: {log.read_text(errors='replace')[-2000:]}")

    yield start
    for server in servers:
        stop(server.process)


@dataclass(frozen=True)
class CollectorProcess:
    address: str  # HOST:PORT it listens on

    @property
    def url(self) -> str:
        return f"http://{self.address}"


@pytest.fixture
def collector(tmp_path: Path) -> Iterator[CollectorProcess]:
    """A real `mfuscope collector` process on 127.0.0.1, port 0 (it writes the bound address)."""
    address_file = tmp_path / "collector.address"
    log = tmp_path / "collector.log"
    command = [
        str(BIN / "mfuscope"),
        "collector",
        "--listen",
        "127.0.0.1:0",
        "--address-file",
        str(address_file),
    ]
    process = spawn(command, log, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        wait_for(lambda: process.poll() is not None or address_file.exists(), 30, "the collector")
        assert process.poll() is None, log.read_text(errors="replace")
        wait_for(lambda: address_file.read_text().endswith("\n"), 5, "the address file")
        yield CollectorProcess(address_file.read_text().strip())
    finally:
        stop(process)


@pytest.fixture(scope="session")
def dashboard_and_rule_promql() -> Callable[[str], list[PromQLSource]]:
    """`promql_sources` (every dashboard and rule expression, variables substituted for a job)."""
    return promql_sources


@pytest.fixture(scope="session")
def free_port() -> Callable[[], int]:
    """A port free on 127.0.0.1 now (another process can take it before it is bound)."""
    return processes.free_port


@pytest.fixture(scope="session")
def wait_until() -> Callable[..., None]:
    """`wait_for(predicate, timeout_s, what)`: poll, and fail the test naming what never came."""
    return wait_for
