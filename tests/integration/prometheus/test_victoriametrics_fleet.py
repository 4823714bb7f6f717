"""The VictoriaMetrics fleet layout for real (deploy/fleet/victoriametrics/): a collector fed by a
2-rank gloo training job with the mfuscope agent; vmagent scrapes it with the shipped scrape
configuration and remote-writes the shipped keep-list to VictoriaMetrics; vmalert evaluates the
shipped rule files there (as vmalert_rules.py writes them) and sends to a real Alertmanager with
the shipped configuration.

A Prometheus beside it receives the very same samples (vmagent's second remote write) and
evaluates the shipped rules itself, so the two rule engines are compared on identical data:

- every rule evaluates in vmalert without error;
- the ratio rules (`RATIOS`) give Prometheus' values. Both engines divide two counters'
  increases over the same samples, as long as the window holds no counter's birth: near it
  Prometheus extrapolates each counter towards its own zero, MetricsQL does not
  (docs/fleet.md#metricsql-and-the-rules), so scraping starts once the counters exist and have
  grown for a while, and the comparison waits until Prometheus extrapolates them all alike;
- every query of the fleet and job dashboards runs on VictoriaMetrics' query API, instant and
  over a range, and the core panels return the job;
- an alert (a rejected batch) reaches Alertmanager and its webhook.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.integration.prometheus.conftest import RULE_FILES, PrometheusServer
from tests.integration.prometheus.test_alertmanager_e2e import (  # noqa: F401 (fixtures)
    Webhook,
    alertmanager,
    webhook,
)
from tests.integration.prometheus.test_prometheus_e2e import CORE_PANELS as PROMETHEUS_CORE_PANELS
from tests.support.agent_helpers import start_job
from tests.support.collector_process import post
from tests.support.processes import stop
from tests.support.victoriametrics import (
    VM_BINARIES,
    Server,
    flushing,
    missing_binaries,
    start_server,
    start_victoria_metrics,
)

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[3]
VM_DIR = ROOT / "deploy" / "fleet" / "victoriametrics"
JOB = "vm-fleet"
JOB_S = 10.0  # seconds of training
SCRAPE_AFTER_S = 6.0  # from the first steps at the collector to the first scrape
CLUSTER = "cluster-a"
# The families the compared rules read: they exist before scraping starts.
FAMILIES = (
    "mfuscope_steps_total",
    "mfuscope_model_flops_total",
    "mfuscope_step_component_seconds_total",
    "mfuscope_collective_bus_bytes_total",
)
# The counters the compared rules (`RATIOS`) read.
COMPARED_COUNTERS = (
    "mfuscope_model_flops_total",
    "mfuscope_hardware_flops_total",
    "mfuscope_peak_flop_seconds_total",
    "mfuscope_step_seconds_total",
    "mfuscope_steps_total",
    "mfuscope_step_component_seconds_total",
    "mfuscope_collective_bus_bytes_total",
    "mfuscope_collective_sized_seconds_total",
)
# vmalert's cadence. A rule that reads another's recorded series (job:mfuscope_elementwise_...
# reads job:mfuscope_mfu:...) must find the previous evaluation's sample searchable, about a
# second after vmalert wrote it.
EVALUATION_INTERVAL = "2s"
# Queries ask this far in the past, where both stores hold everything that was sent.
LAG_S = 3.0

# Recorded ratios of counters over the same window, and a gauge sum.
RATIOS = (
    "job:mfuscope_mfu:ratio_rate5m",
    "job:mfuscope_hfu:ratio_rate5m",
    "job:mfuscope_step_duration_seconds:mean5m",
    "job_component:mfuscope_step_fraction:ratio_rate5m",
    "job:mfuscope_exposed_comm_fraction:ratio_rate5m",
    "job_op_axis_tier:mfuscope_collective_busbw_bytes_per_second:ratio_rate5m",
    "job:mfuscope_peak_flops:sum",
)
# (dashboard, panel title) -> the queries that must return the job: the Prometheus end-to-end
# test's core panels of the fleet and job dashboards (it says why the others stay empty for a CPU
# gloo job), and two the fleet dashboard shows here: the job count and the firing alert.
CORE_PANELS: dict[tuple[str, str], set[str]] = {
    key: refs
    for key, refs in PROMETHEUS_CORE_PANELS.items()
    if key[0] in ("mfuscope-fleet", "mfuscope-job")
} | {
    ("mfuscope-fleet", "Jobs reporting"): {"A"},
    ("mfuscope-fleet", "Firing mfuscope alerts"): {"A"},
}

Vector = dict[tuple[tuple[str, str], ...], float]


@dataclass
class Stack:
    """The central side: VictoriaMetrics with vmalert, and the reference Prometheus."""

    home: Path
    vm: Server
    vmalert: Server
    reference: PrometheusServer
    servers: list[Server] = field(default_factory=list)  # all but the reference, in start order

    def start_vmagent(self, collector: str) -> None:
        """vmagent with the shipped files, scraping `collector` every second and writing to
        both stores."""
        config: dict[str, Any] = yaml.safe_load((VM_DIR / "vmagent-scrape.yml").read_text())
        config["global"]["scrape_interval"] = "1s"
        (scrape,) = config["scrape_configs"]
        scrape["static_configs"] = [{"targets": [collector]}]
        scrape_file = self.home / "vmagent-scrape.yml"
        scrape_file.write_text(yaml.safe_dump(config), encoding="utf-8")
        relabel = VM_DIR / "vmagent-remote-write.yml"
        command = ["vmagent", f"-promscrape.config={scrape_file}"]
        for url in (self.vm.url, self.reference.url):
            command += [f"-remoteWrite.url={url}/api/v1/write"]
            command += [f"-remoteWrite.urlRelabelConfig={relabel}"]
        command += [f"-remoteWrite.label=cluster={CLUSTER}", "-loggerLevel=WARN"]
        command += [f"-remoteWrite.tmpDataPath={self.home / 'vmagent'}"]
        self.servers.append(
            start_server(
                "vmagent", lambda address: [*command, f"-httpListenAddr={address}"], self.home
            )
        )

    def rules(self) -> list[dict[str, Any]]:
        """vmalert's rules with their state (`health`, `lastError`, `lastEvaluation`, ...)."""
        groups = _get(self.vmalert.url, "/api/v1/rules")["data"]["groups"]
        return [rule for group in groups for rule in group["rules"]]


@pytest.fixture
def stack(
    alertmanager: str,  # noqa: F811 (the fixture)
    start_prometheus: Callable[..., PrometheusServer],
    tmp_path: Path,
) -> Iterator[Stack]:
    reason = missing_binaries(VM_BINARIES)
    if reason:
        pytest.skip(reason)
    home = tmp_path / "central"
    rules = home / "rules"
    command = [sys.executable, str(VM_DIR / "vmalert_rules.py"), "--out", str(rules)]
    command += ["--interval", EVALUATION_INTERVAL, *map(str, RULE_FILES)]
    generated = subprocess.run(command, capture_output=True, text=True, timeout=60)
    assert generated.returncode == 0, generated.stderr

    reference = start_prometheus(
        [],
        config={
            "global": {"evaluation_interval": "1s"},
            "rule_files": [str(path) for path in RULE_FILES],
        },
        flags=("--web.enable-remote-write-receiver",),
    )
    servers: list[Server] = []
    try:
        vm = start_victoria_metrics(home)
        servers.append(vm)
        vmalert = start_server(
            "vmalert",
            lambda address: [
                "vmalert",
                f"-rule={rules}/*.yml",
                f"-evaluationInterval={EVALUATION_INTERVAL}",
                f"-datasource.url={vm.url}",
                f"-remoteWrite.url={vm.url}",
                "-remoteWrite.flushInterval=200ms",
                f"-remoteRead.url={vm.url}",
                f"-notifier.url=http://{alertmanager}",
                f"-httpListenAddr={address}",
                "-loggerLevel=WARN",
            ],
            home,
        )
        servers.append(vmalert)
        with flushing(vm.url):
            yield Stack(home, vm, vmalert, reference, servers)
    finally:
        for server in reversed(servers):  # vmagent first: nothing writes into a stopped store
            stop(server.process)


def _get(url: str, path: str, params: dict[str, str] | None = None) -> Any:
    query = f"?{urllib.parse.urlencode(params)}" if params else ""
    with urllib.request.urlopen(f"{url}{path}{query}", timeout=10) as response:
        return json.load(response)


def _query(url: str, expr: str, at: float) -> dict[str, Any]:
    """`/api/v1/query` of `expr` at Unix time `at`: the decoded response (also for a 4xx)."""
    try:
        body: dict[str, Any] = _get(url, "/api/v1/query", {"query": expr, "time": f"{at:.3f}"})
    except urllib.error.HTTPError as error:  # 400/422: a bad query, with a JSON body
        with error:
            body = json.load(error)
    return body


def _vector(url: str, expr: str, at: float) -> Vector:
    """The instant vector of `expr` at `at` as {sorted labels without the name: value}."""
    response = _query(url, expr, at)
    assert response["status"] == "success", (expr, response)
    return {
        tuple(sorted((k, v) for k, v in s["metric"].items() if k != "__name__")): float(
            s["value"][1]
        )
        for s in response["data"]["result"]
    }


def _collector_series(collector_url: str) -> list[tuple[str, float]]:
    """(family, value) of every series of the job on the collector's /metrics."""
    with urllib.request.urlopen(f"{collector_url}/metrics", timeout=10) as response:
        lines = response.read().decode().splitlines()
    return [
        (line.split("{", 1)[0], float(line.rsplit(" ", 1)[1]))
        for line in lines
        if f'job="{JOB}"' in line and not line.startswith("#")
    ]


def _collector_steps(collector_url: str) -> float:
    """The job's rank-steps at the collector."""
    return sum(v for family, v in _collector_series(collector_url) if family == FAMILIES[0])


def _unix(timestamp: str) -> float:
    """vmalert's RFC 3339 timestamp (nanoseconds) as Unix seconds."""
    seconds, _, fraction = timestamp.rstrip("Z").partition(".")
    whole = datetime.fromisoformat(seconds + "+00:00").timestamp()
    return whole + float(f"0.{fraction or 0}")


@pytest.fixture
def training(collector: Any, tmp_path: Path) -> Iterator[subprocess.Popen[bytes]]:
    """The job, started before the central side (it takes longer to start)."""
    job = start_job(
        tmp_path,
        "--duration-s", str(JOB_S),
        "--job", JOB,
        "--collector-url", collector.url,
        "--option", "profile_first_step=2",
        "--option", "profile_steps=2",
        "--option", "profile_every_s=1",
        "--option", "profile_max_overhead_ratio=1",
        "--option", "flush_interval_s=0.5",
        "--close-timeout-s", "60",
    )  # fmt: skip
    yield job
    stop(job)


def _scrape(
    stack: Stack,
    job: subprocess.Popen[bytes],
    collector: Any,
    tmp_path: Path,
    wait_until: Callable[..., None],
) -> None:
    """Start vmagent once every family in `FAMILIES` exists and the job has trained for
    `SCRAPE_AFTER_S` (no counter is born inside the compared window, and each one's first
    sample there is large against its increase: see `_extrapolated_alike`); wait for the job's
    end."""
    log = tmp_path / "job.log"
    wait_until(
        lambda: job.poll() is not None or _collector_steps(collector.url) > 0,
        90,
        "the job's first steps at the collector",
    )
    first_steps = time.monotonic()
    wait_until(
        lambda: (
            job.poll() is not None
            or set(FAMILIES) <= {family for family, _ in _collector_series(collector.url)}
        ),
        60,
        "the job's first analysed window at the collector",
    )
    time.sleep(max(0.0, first_steps + SCRAPE_AFTER_S - time.monotonic()))
    assert job.poll() is None, log.read_text(errors="replace")[-3000:]
    stack.start_vmagent(collector.address)
    assert job.wait(timeout=120) == 0, log.read_text(errors="replace")[-3000:]


def _extrapolated_alike(store_url: str) -> bool:
    """Whether Prometheus extrapolates every counter of `COMPARED_COUNTERS` in the store alike.

    For a series younger than the window, Prometheus extends the increase from its n samples by
    half an interval at the start, unless the counter would reach zero sooner: when
    first / increase * (n - 1) < 1.1 it extends by that time to zero instead, a different
    amount per counter, and a ratio of two counters moves (promql/functions.go,
    extrapolatedRate). MetricsQL never extrapolates. Every constant sample after the job ends
    adds to n; four are left out here for the samples newer than the compared time."""
    match = "|".join(COMPARED_COUNTERS)
    selector = f'{{__name__=~"{match}", job="{JOB}"}}'
    with urllib.request.urlopen(
        f"{store_url}/api/v1/export?{urllib.parse.urlencode({'match[]': selector})}", timeout=10
    ) as response:
        series = [json.loads(line) for line in response.read().decode().splitlines()]
    for one in series:
        values = one["values"]
        increase = values[-1] - values[0]
        if increase > 0 and values[0] / increase * (len(values) - 5) < 1.1:
            return False
    return bool(series)


def _settle(stack: Stack, collector: Any, wait_until: Callable[..., None]) -> float:
    """Wait until both stores hold the job's final counts and both rule engines evaluated on
    them; return a time at which to compare them."""
    final = _collector_steps(collector.url)
    steps = f'sum({FAMILIES[0]}{{job="{JOB}"}})'
    for url in (stack.vm.url, stack.reference.url):
        wait_until(
            lambda u=url: list(_vector(u, steps, time.time() - LAG_S).values()) == [final],
            30,
            f"{steps} == {final} in {url}",
        )
    wait_until(
        lambda: _extrapolated_alike(stack.vm.url),
        60,
        "enough samples for Prometheus to extrapolate every compared counter alike",
    )
    settled = time.time() - LAG_S
    wait_until(
        lambda: all(_unix(r["lastEvaluation"]) > settled + 2 for r in stack.rules()),
        20,
        "vmalert to evaluate every rule on the final data",
    )
    time.sleep(max(0.0, settled + 4 + 2 * LAG_S - time.time()))
    return time.time() - LAG_S


def _dashboard_gaps(
    url: str, at: float, sources: list[Any]
) -> tuple[list[Any], list[Any], dict[tuple[str, str], set[str]]]:
    """Run every dashboard query at `at` (instant) and over the minute before it (range):
    (errors, core queries without data, the core queries that returned data)."""
    errors, empty = [], []
    covered: dict[tuple[str, str], set[str]] = {key: set() for key in CORE_PANELS}
    for source in sources:
        if source.kind not in ("panel", "variable"):
            continue
        instant = _query(url, source.expr, at)
        ranged = _get(
            url,
            "/api/v1/query_range",
            {"query": source.expr, "start": f"{at - 60:.3f}", "end": f"{at:.3f}", "step": "1"},
        )
        if instant["status"] != "success" or ranged["status"] != "success":
            errors.append((source.origin, instant.get("error"), ranged.get("error")))
            continue
        result = instant["data"]["result"]
        if source.kind == "variable":
            if source.label == "job" and JOB not in {s["metric"].get("job") for s in result}:
                empty.append((source.origin, "the job is not listed"))
            continue
        dashboard, rest = source.origin.split(" / ", 1)
        title, ref = rest.rsplit(" / ", 1)
        if ref in CORE_PANELS.get((dashboard, title), set()):
            if result and ranged["data"]["result"]:
                covered[(dashboard, title)].add(ref)
            else:
                empty.append((source.origin, source.expr))
    return errors, empty, covered


def test_rules_and_dashboards_run_on_victoriametrics_as_on_prometheus(
    collector: Any,
    training: subprocess.Popen[bytes],
    stack: Stack,
    webhook: Webhook,  # noqa: F811 (the fixture)
    dashboard_and_rule_promql: Callable[[str], list[Any]],
    wait_until: Callable[..., None],
    tmp_path: Path,
) -> None:
    _scrape(stack, training, collector, tmp_path, wait_until)
    # A batch without a schema: refused (400) and counted as `invalid`, which alerts.
    assert post(collector.url, {})[0] == 400
    at = _settle(stack, collector, wait_until)

    # Every rule (the rewritten MFUScopeAgentsSilent too) evaluates in vmalert without error.
    rules = stack.rules()
    shipped = sum(
        len(group["rules"])
        for path in RULE_FILES
        for group in yaml.safe_load(path.read_text(encoding="utf-8"))["groups"]
    )
    assert len(rules) == shipped
    unhealthy = [(r["name"], r.get("lastError")) for r in rules if r["health"] != "ok"]
    assert not unhealthy, unhealthy

    # Every recording rule gives the series Prometheus' gives (values aside: see `RATIOS`).
    records = sorted({r["name"] for r in rules if r["type"] == "recording"})
    differ = {}
    for record in records:
        ours, theirs = _vector(stack.vm.url, record, at), _vector(stack.reference.url, record, at)
        if ours.keys() != theirs.keys():
            differ[record] = (sorted(ours), sorted(theirs))
    assert not differ, differ

    # The ratio rules: vmalert's results are Prometheus' on the same samples.
    for record in RATIOS:
        selector = f'{record}{{job="{JOB}"}}'
        ours, theirs = (
            _vector(stack.vm.url, selector, at),
            _vector(stack.reference.url, selector, at),
        )
        assert ours, f"vmalert recorded no {selector}"
        assert ours.keys() == theirs.keys(), (record, ours, theirs)
        for labels, value in ours.items():
            # VictoriaMetrics stores 12 significant digits.
            assert math.isclose(value, theirs[labels], rel_tol=1e-9), (record, labels, value)

    # Every dashboard query runs on VictoriaMetrics; the core panels return the job.
    errors, empty, covered = _dashboard_gaps(stack.vm.url, at, dashboard_and_rule_promql(JOB))
    assert not errors, errors
    assert not empty, empty
    assert covered == CORE_PANELS, "a core panel was renamed or lost a query"

    # vmalert fired MFUScopeReportsRejected (no `for`) and Alertmanager routed it with the
    # shipped configuration (warning -> team-channel).
    wait_until(
        lambda: any(
            receiver == "team-channel" and alert["labels"]["alertname"] == "MFUScopeReportsRejected"
            for receiver, _status, alert in webhook.alerts()
        ),
        30,
        lambda: f"MFUScopeReportsRejected at the webhook; got {webhook.alerts()}",
    )
