"""The collector never imports torch nor the agent: a fresh interpreter builds the CLI, serves real
HTTP (ingest, /metrics, /v1/summary), builds OTLP data, and must end with neither loaded."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

# The script imports the batch builder from tests/support, so it runs from the checkout's root.
ROOT = Path(__file__).resolve().parents[2]

SCRIPT = textwrap.dedent(
    """
    import asyncio, json, sys, threading, urllib.request

    from mfuscope.cli import build_parser
    from mfuscope.collector.app import resolve_config
    from mfuscope.collector._aggregator import Aggregator
    from mfuscope.collector._routes import Routes
    from mfuscope.collector._server import bind_socket, serve_until
    from tests.support.collector_fakes import batch_dict, report_dict
    from mfuscope.exporters.otlp import metrics_data
    from opentelemetry.sdk.resources import Resource

    args = vars(build_parser().parse_args(["collector", "--listen", "127.0.0.1:0"]))
    settings = {k: v for k, v in args.items() if k not in ("command", "log_level")}
    config = resolve_config(settings, {})
    collector = Aggregator(config.state_config())
    routes = Routes(collector)
    loop = asyncio.new_event_loop()
    stop = asyncio.Event()
    started = threading.Event()
    address = []

    def on_started(addr):
        address.append(addr)
        started.set()

    sock = bind_socket(*config.host_port)
    thread = threading.Thread(
        target=loop.run_until_complete, args=(serve_until(routes, sock, stop, on_started),)
    )
    thread.start()
    assert started.wait(30)
    url = "http://%s:%d" % address[0]
    collectives = [{"op": "all_reduce", "axis": "dp", "tier": "intra_node", "group_size": 2,
                    "bytes": 10, "count": 1, "seconds": 0.1, "overlapped_s": 0.0}]
    body = json.dumps(batch_dict(reports=[report_dict(1, collectives=collectives)])).encode()
    request = urllib.request.Request(url + "/v1/reports", data=body,
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request) as r:
        assert json.loads(r.read())["accepted"] == 1
    for path in ("/metrics", "/v1/summary"):
        with urllib.request.urlopen(url + path) as r:
            assert r.status == 200 and r.read()
    metrics_data(collector.families(), resource=Resource.create({}), now_unix_ns=1,
                 default_start_unix_ns=1)
    loop.call_soon_threadsafe(stop.set)
    thread.join(30)
    print("torch" in sys.modules, "mfuscope.agent" in sys.modules)
    """
)


def test_collector_never_imports_torch() -> None:
    result = subprocess.run(
        [sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=120, cwd=ROOT
    )
    assert result.returncode == 0, result.stderr
    torch_loaded, agent_loaded = result.stdout.split()
    assert torch_loaded == "False"
    assert agent_loaded == "False", "the collector must never import mfuscope.agent"
