"""`mfuscope analyze` and `mfuscope report --traces` split the same pipeline trace the same way:
both build the engine's options with `core.trace.options`, link models included."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from mfuscope.cli import main
from mfuscope.cli.report._load import TraceOptions
from mfuscope.cli.report._traces import run_from_traces

from tests.support.trace_builder import Group, TraceBuilder

PP = Group("3", "mesh_pp", (0, 1))  # one host: the H100's NVLink tier


def _pipeline_trace(path: Path) -> Path:
    b = TraceBuilder(world_size=2, groups=(PP,))
    b.profiler_step(1, 0.0, 50.0)
    b.kernel(100.0, 10.0, launch_at=1.0)  # [100, 110)
    # A pipeline receive exposed for 30 µs: its ideal NVLink transfer time counts as exposed
    # communication, the rest as pipeline bubble (with no link model it would all be bubble).
    b.comm_kernel(100.0, 40.0, op="recv", group=PP, nelems=2000, launch_at=2.0)
    path.write_text(json.dumps(b.build()))
    return path


def test_analyze_and_report_split_a_pipeline_trace_the_same_way(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = _pipeline_trace(tmp_path / "rank0.json")
    assert main(["analyze", "--json", str(trace)]) == 0
    (analyzed,) = json.loads(capsys.readouterr().out)["ranks"][0]["steps"]
    (reported,) = run_from_traces([trace], TraceOptions()).ranks[0].steps

    seconds = {c.component: c.seconds for c in reported.components}
    assert analyzed["exposed_comm_s"] > 0 and analyzed["bubble_pipeline_s"] > 0
    assert seconds["exposed_comm"] == pytest.approx(analyzed["exposed_comm_s"], rel=1e-12)
    assert seconds["bubble_pipeline"] == pytest.approx(analyzed["bubble_pipeline_s"], rel=1e-12)
    assert seconds["compute"] == pytest.approx(analyzed["compute_s"], rel=1e-12)
