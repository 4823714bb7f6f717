"""Per-node sidecars, one job: the hang cause is joined by the store's rules, not by a collector.

A 4-rank gloo job on the groups of a 2 x 2 (dp, tp) mesh (`tests/support/mesh_job.py`,
`mesh_groups`), one rank per "node" (``MFUSCOPE_NODE_NAME=node{r}``), each rank reporting to its
own node's sidecar collector: every process group spans two sidecars. A real Prometheus scrapes
the four sidecars every second (`honor_labels: true`) with the shipped rules; vmagent scrapes them
too and remote-writes to VictoriaMetrics, where vmalert evaluates the same rules every second.
MFUScopeCollectiveHang pages after `PAGE_AFTER_S` of waiting instead of 60 s (promtool checks the
shipped threshold): it fires before rank 2's progress reaches the rules, and its cause names rank
2 from then on. The job and the servers belong to the one test, which checks the stages of the job
in the order they happen.

Rank 2 stops at the start of a step, before its first collective, until the test lets it go. Its
tp peer, rank 3 (node3), waits in their tp all_reduce; rank 0 (node0) waits in its dp all_reduce
with rank 2; rank 1 (node1) waits in its dp all_reduce with rank 3, which is itself blocked: a
waiting chain 1 -> 3 -> 2 across three nodes. Rank 2 has no node-mate in any of its groups, so
no sidecar can name it from its own ranks (none does), and rank 2's own sidecar sees nothing
blocked. The rules must name rank 2 alone, with its node, the op, the axis and the seq it would
enter next, on Prometheus and on vmalert (that the page goes out within 2 min of the stall is
checked on a scripted clock by `test_sidecar_scale.py`); after rank 2 resumes and the job ends
normally, nothing pages, and vmalert's step goodput never went above 1. Rank 1 enters
every step's collectives a quarter of a step late: both engines join the tp group's skew across
the two sidecars that hold it.
"""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.integration.prometheus.conftest import (
    PrometheusServer,
    prometheus_config,
    wait_for,
)
from tests.support.mesh_runs import hang_rule_files, mesh_job, scrape, start_collectors
from tests.support.processes import free_port, http_ready, spawn, stop
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
NODES, STALL_RANK, STALL_STEP = 4, 2, 35
STEPS = STALL_STEP + 2
# Ranks count as blocked after core.hangs.BLOCKED_AFTER_S (10 s), rank 2 is overdue after
# core.hangs.OVERDUE_AFTER_S (20 s): the page goes out between the two.
PAGE_AFTER_S = 15
# Every rank sleeps STEP_S at the start of each step and rank 1 LATE_S more: it enters each step's
# collectives a quarter of a step late (at a tenth, a loaded machine's noise hid it). The sidecars
# hold one arrival sample per rank and group every ARRIVAL_SAMPLE_S (60 s by default) and the
# agents read their recorders every READ_INTERVAL_S (5 s by default): short here, so that several
# periods pass before the stall.
STEP_S, LATE_RANK, LATE_S = 0.2, 1, 0.05
ARRIVAL_SAMPLE_S, READ_INTERVAL_S = 2.0, 0.1
JOB = "groups-mesh_groups"
SUSPECTS = "job_rank:mfuscope_collective_hang_suspect:seconds"


@dataclass
class Hang:
    sidecars: list[str]  # HOST:PORT, node r's at index r
    prometheus: PrometheusServer
    vm: Server
    vmalert: Server
    job: subprocess.Popen[bytes]
    out: Path
    resume: Path
    next_seq: dict[str, int]  # axis -> the seq rank 2 would enter next

    def log(self) -> str:
        return (self.out / "job.log").read_text(errors="replace")[-4000:]


def _prometheus(
    home: Path, targets: list[str], rules: list[Path]
) -> tuple[subprocess.Popen[bytes], str]:
    home.mkdir()
    config_file = home / "prometheus.yml"
    config = prometheus_config(targets, rule_files=rules)
    config_file.write_text(yaml.safe_dump(config), encoding="utf-8")
    port = free_port()
    command = ["prometheus", f"--config.file={config_file}", f"--storage.tsdb.path={home}/tsdb"]
    command += [f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn"]
    process = spawn(command, home / "prometheus.log")
    url = f"http://127.0.0.1:{port}"
    wait_for(lambda: http_ready(url + "/-/ready"), 30, "Prometheus")
    return process, url


def _vm_stack(home: Path, targets: list[str], rule_files: list[Path]) -> list[Server]:
    rules = home / "rules"
    command = [sys.executable, str(VM_DIR / "vmalert_rules.py"), "--out", str(rules)]
    generated = subprocess.run(
        [*command, "--interval", "1s", *map(str, rule_files)], capture_output=True, text=True
    )
    assert generated.returncode == 0, generated.stderr
    servers = []
    vm = start_victoria_metrics(home)
    servers.append(vm)
    config: dict[str, Any] = yaml.safe_load((VM_DIR / "vmagent-scrape.yml").read_text())
    config["global"]["scrape_interval"] = "1s"
    (scrape_config,) = config["scrape_configs"]
    scrape_config["static_configs"] = [{"targets": targets}]
    scrape_file = home / "vmagent-scrape.yml"
    scrape_file.write_text(yaml.safe_dump(config), encoding="utf-8")
    servers.append(
        start_server(
            "vmagent",
            lambda address: [
                "vmagent",
                f"-promscrape.config={scrape_file}",
                f"-remoteWrite.url={vm.url}/api/v1/write",
                f"-remoteWrite.urlRelabelConfig={VM_DIR / 'vmagent-remote-write.yml'}",
                f"-remoteWrite.tmpDataPath={home / 'vmagent'}",
                f"-httpListenAddr={address}",
                "-loggerLevel=WARN",
            ],
            home,
        )
    )
    servers.append(
        start_server(
            "vmalert",
            lambda address: [
                "vmalert",
                f"-rule={rules}/*.yml",
                "-evaluationInterval=1s",
                f"-datasource.url={vm.url}",
                f"-remoteWrite.url={vm.url}",
                "-remoteWrite.flushInterval=200ms",
                f"-remoteRead.url={vm.url}",
                # Nothing listens there: the test reads vmalert's own alert API.
                f"-notifier.url=http://127.0.0.1:{free_port()}",
                f"-httpListenAddr={address}",
                "-loggerLevel=ERROR",
            ],
            home,
        )
    )
    return servers


@pytest.fixture
def hang(tmp_path: Path) -> Iterator[Hang]:
    """The job, stopped on rank 2, and every server watching it (all ended after the test)."""
    reason = missing_binaries(VM_BINARIES)
    if reason:
        pytest.skip(reason)
    home = tmp_path
    processes: list[subprocess.Popen[bytes]] = []
    servers: list[Server] = []
    job: subprocess.Popen[bytes] | None = None
    resume = home / "resume"
    log = (home / "job.log").open("w")
    try:
        # The sidecars, node r's at index r.
        processes, sidecars = start_collectors(
            home, NODES, "--arrival-sample", str(ARRIVAL_SAMPLE_S)
        )
        command, env = mesh_job(
            home,
            NODES,
            *("--layout", "mesh_groups", "--shape", "2x2", "--no-profile", "--steps", str(STEPS)),
            *("--stall-rank", str(STALL_RANK), "--stall-step", str(STALL_STEP)),
            *("--resume-file", str(resume), "--out", str(home), "--node-per-rank"),
            *("--collector-url", ",".join(f"http://{a}" for a in sidecars)),
            *("--late-rank", str(LATE_RANK), "--late-s", str(LATE_S), "--step-s", str(STEP_S)),
            *("--read-interval", str(READ_INTERVAL_S)),
        )
        job = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT)
        # The stores start while torchrun does.
        rules = hang_rule_files(home / "rules", PAGE_AFTER_S)
        process, url = _prometheus(home / "prometheus", sidecars, rules)
        processes.append(process)
        servers = _vm_stack(home / "vm", sidecars, rules)
        stall = home / "stall.json"
        # Flushing from the start: rank 2 has arrival figures only in the periods before its
        # stall (a few seconds), and vmalert must see them while they last. Left to itself,
        # VictoriaMetrics makes a new series searchable seconds late, later under load; once a
        # CI run's vmalert never saw rank 2's figures.
        with flushing(servers[0].url):
            wait_for(lambda: stall.exists() or job.poll() is not None, 240, "rank 2 to stop")
            assert job.poll() is None, (home / "job.log").read_text()[-4000:]
            next_seq = {
                desc.removeprefix("mesh_"): seq
                for desc, seq in json.loads(stall.read_text()).items()
            }
            yield Hang(
                sidecars,
                PrometheusServer(url, process, home / "prometheus" / "prometheus.log"),
                servers[0],
                servers[2],
                job,
                home,
                resume,
                next_seq,
            )
    finally:
        resume.write_text("go")
        if job is not None and job.poll() is None:
            try:
                job.wait(timeout=60)
            except subprocess.TimeoutExpired:
                job.kill()
                job.wait(timeout=60)
        log.close()
        for server in reversed(servers):
            stop(server.process)
        for process in reversed(processes):
            stop(process)


def _get(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=10) as response:
        return json.load(response)


def _prometheus_alerts(hang: Hang) -> list[dict[str, Any]]:
    alerts: list[dict[str, Any]] = _get(hang.prometheus.url + "/api/v1/alerts")["data"]["alerts"]
    return [a for a in alerts if a["labels"].get("job") == JOB and a["state"] == "firing"]


def _vmalert_alerts(hang: Hang) -> list[dict[str, Any]]:
    alerts: list[dict[str, Any]] = _get(hang.vmalert.url + "/api/v1/alerts")["data"]["alerts"]
    return [a for a in alerts if a["labels"].get("job") == JOB and a["state"] == "firing"]


def _hang_alert(alerts: list[dict[str, Any]]) -> dict[str, Any] | None:
    found = [a for a in alerts if a["labels"]["alertname"] == "MFUScopeCollectiveHang"]
    # The cause names a rank once the rule has joined the stalled rank's progress.
    return next((a for a in found if a["annotations"]["cause"].startswith("rank ")), None)


def _expected_cause(hang: Hang, labels: dict[str, str]) -> str:
    axis, seq = labels["axis"], labels["seq"]
    return f"rank {STALL_RANK} (node node{STALL_RANK}) never joined all_reduce #{seq} on {axis}/"


def _check_cause(hang: Hang, alert: dict[str, Any]) -> None:
    cause = alert["annotations"]["cause"]
    assert cause.startswith(f"rank {STALL_RANK} (node node{STALL_RANK}) never joined all_reduce #")
    # The axis and seq rank 2 would have entered next on that axis, counted by rank 2 itself.
    on = cause.split(" on ", 1)[1].split("/", 1)[0]
    seq = int(cause.split("#", 1)[1].split(" ", 1)[0])
    assert on in hang.next_seq and seq == hang.next_seq[on], (cause, hang.next_seq)
    # No other rank: one suspect, and 3 ranks waiting.
    assert cause.count("rank ") == 1 and f"; {NODES - 1} ranks waiting " in cause, cause


def test_the_rules_name_the_stalled_rank_and_a_normal_end_pages_nobody(hang: Hang) -> None:
    _no_sidecar_can_name_the_rank_on_its_own(hang)
    _prometheus_names_the_stalled_rank_alone(hang)
    _vmalert_names_the_stalled_rank_alone(hang)
    _arrival_skew_across_nodes(hang)
    _a_normal_end_pages_nobody(hang)


def _no_sidecar_can_name_the_rank_on_its_own(hang: Hang) -> None:
    # Every rank but rank 2 is blocked, each on its own node: the sidecars hold the waits and,
    # once its step is overdue, rank 2's progress; none names a suspect itself.
    wait_for(
        lambda: bool(
            scrape(f"http://{hang.sidecars[STALL_RANK]}", "mfuscope_collective_group_entered_seq")
        ),
        120,
        "rank 2's sidecar to export its progress",
    )
    for node, address in enumerate(hang.sidecars):
        url = f"http://{address}"
        assert not scrape(url, "mfuscope_collective_hang_suspect_seconds"), node
        blocked = sum(v for _, v in scrape(url, "mfuscope_collective_blocked_ranks"))
        assert blocked == (0 if node == STALL_RANK else 1), (node, blocked)
    entered = scrape(f"http://{hang.sidecars[STALL_RANK]}", "mfuscope_collective_group_entered_seq")
    assert {labels["rank"] for labels, _ in entered} == {str(STALL_RANK)}
    assert {labels["node"] for labels, _ in entered} == {f"node{STALL_RANK}"}


def _prometheus_names_the_stalled_rank_alone(hang: Hang) -> None:
    def named() -> list[dict[str, Any]]:
        return hang.prometheus.samples(SUSPECTS)

    wait_for(lambda: bool(named()), 180, "the rule to name a suspect on Prometheus")
    ((suspect),) = named()
    labels = suspect["metric"]
    assert labels["rank"] == str(STALL_RANK) and labels["node"] == f"node{STALL_RANK}"
    assert labels["reason"] == "not_joined" and labels["op"] == "all_reduce"
    assert labels["axis"] in hang.next_seq
    assert labels["seq"] == str(hang.next_seq[labels["axis"]]), (labels, hang.next_seq)
    assert labels["tier"] != "intra_node"  # every group spans nodes
    wait_for(lambda: _hang_alert(_prometheus_alerts(hang)) is not None, 180, "the page")
    alert = _hang_alert(_prometheus_alerts(hang))
    assert alert is not None
    _check_cause(hang, alert)


def _vmalert_names_the_stalled_rank_alone(hang: Hang) -> None:
    wait_for(lambda: _hang_alert(_vmalert_alerts(hang)) is not None, 180, "vmalert's page")
    alert = _hang_alert(_vmalert_alerts(hang))
    assert alert is not None
    _check_cause(hang, alert)
    query = urllib.parse.urlencode({"query": SUSPECTS})
    result = _get(f"{hang.vm.url}/api/v1/query?{query}")["data"]["result"]
    assert [r["metric"]["rank"] for r in result] == [str(STALL_RANK)], result


def _by_label(samples: list[dict[str, Any]], label: str) -> dict[str, float]:
    return {s["metric"][label]: float(s["value"][1]) for s in samples}


def _arrival_skew_across_nodes(hang: Hang) -> None:
    # Rank 1 enters each step's collectives a quarter of a step late; every group spans two
    # sidecars, so no sidecar has a skew of its own: the rules join the held samples, one
    # collective per group and period. A period in which a boundary fell between two ranks'
    # enqueue times of one collective (about a quarter of them here) gives no figure: hence
    # figures over the job's life (the periods before the stall, and the one the stall froze).
    for address in hang.sidecars:
        assert not scrape(f"http://{address}", "mfuscope_collective_arrival_skew_seconds")
        assert scrape(f"http://{address}", "mfuscope_collective_arrival_enqueued_seconds")
    skew = 'max_over_time(job_axis_tier:mfuscope_collective_arrival_skew:seconds{axis="tp"}[5m])'
    late = "avg_over_time(job_rank:mfuscope_collective_arrival_lateness:seconds[5m])"
    wait_for(
        lambda: len(hang.prometheus.samples(late)) == NODES,
        60,
        lambda: (
            "the arrival rules on every rank, "
            f"so far {sorted(_by_label(hang.prometheus.samples(late), 'rank'))}"
        ),
    )
    # The tp group {0, 1}: rank 1 arrives LATE_S after rank 0, give or take scheduling noise, which
    # on 2 loaded cores delays either rank's enqueue (VictoriaMetrics read 0.66-0.69 x LATE_S).
    # Half of LATE_S still tells the injected lateness from none.
    (tp,) = hang.prometheus.samples(skew)
    assert LATE_S * 0.5 <= float(tp["value"][1]) <= LATE_S * 10, tp
    # Every rank's lateness is joined across the sidecars. Which rank is latest over the job's
    # life is not asserted: the stall freezes one period's samples for minutes, and their average
    # is that period's (the arithmetic is promtool's, deploy/prometheus/tests/arrivals_test.yml).
    assert set(_by_label(hang.prometheus.samples(late), "rank")) == {str(r) for r in range(NODES)}

    # The same on VictoriaMetrics (vmalert's recorded series): the tp skew and every rank.
    def on_vm(query: str) -> list[dict[str, Any]]:
        encoded = urllib.parse.urlencode({"query": query})
        result: list[dict[str, Any]] = _get(f"{hang.vm.url}/api/v1/query?{encoded}")["data"][
            "result"
        ]
        return result

    wait_for(
        lambda: len(on_vm(late)) == NODES,
        120,  # vmalert records from vmagent's remote writes: seconds behind, more under load
        lambda: (
            "vmalert's arrival rules on every rank, "
            f"so far {sorted(_by_label(on_vm(late), 'rank'))}"
        ),
    )
    (tp_on_vm,) = on_vm(skew)
    assert LATE_S * 0.5 <= float(tp_on_vm["value"][1]) <= LATE_S * 10, tp_on_vm


def _evaluations(hang: Hang) -> tuple[float, float]:
    """Rule group evaluations so far: Prometheus's and vmalert's (their own counters)."""
    prometheus = scrape(hang.prometheus.url, "prometheus_rule_group_iterations_total")
    vmalert = scrape(hang.vmalert.url, "vmalert_iteration_total")
    return min(v for _, v in prometheus), min(v for _, v in vmalert)


def _a_normal_end_pages_nobody(hang: Hang) -> None:
    hang.resume.write_text("go")
    assert hang.job.wait(timeout=120) == 0, hang.log()

    def quiet() -> bool:
        return not _prometheus_alerts(hang) and not _vmalert_alerts(hang)

    wait_for(quiet, 30, "every alert of the job to resolve")
    # Closed agents wait for nothing and are overdue for nothing: no hang series anywhere.
    for address in hang.sidecars:
        for name in ("group_entered_seq", "group_waiting_seq", "blocked_ranks"):
            assert not scrape(f"http://{address}", f"mfuscope_collective_{name}"), name
    assert not hang.prometheus.samples(SUSPECTS)
    # Three more evaluations of every rule group on both engines: still nobody paged.
    before = _evaluations(hang)
    wait_for(
        lambda: all(a >= b + 3 for a, b in zip(_evaluations(hang), before, strict=True)),
        60,
        "three more evaluations of the rules",
    )
    assert quiet()
    assert not hang.prometheus.samples(f'ALERTS{{job="{JOB}", alertstate="firing"}}')
    # The step rate fell at the stall and at the end: a ratio whose numerator vmalert read from
    # its previous evaluation rose above 1 there (docs/fleet.md#metricsql-and-the-rules). Over the
    # whole job, on VictoriaMetrics, step goodput stays at most 1 (nothing was redone: exactly 1).
    query = urllib.parse.urlencode(
        {"query": f'max_over_time(job:mfuscope_useful_steps:ratio_rate5m{{job="{JOB}"}}[10m])'}
    )
    (goodput,) = _get(f"{hang.vm.url}/api/v1/query?{query}")["data"]["result"]
    assert float(goodput["value"][1]) <= 1.0, goodput
