"""`mfuscope analyze` on gloo traces with several groups: the group-size column says unknown
(never the world size), the user's axis mapping comes from --axis or MFUSCOPE_AXIS_OVERRIDES,
and a trace kept by the agent (with its worker-thread map) names every group."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from mfuscope.cli import main
from mfuscope.core.trace.worker_groups import TRACE_KEY, trace_fields

from tests.support.trace_builder import Group, TraceBuilder

GROUPS = (
    Group("0", "default_pg", (0, 1, 2, 3)),
    Group("1", "mesh_dp", (0, 2)),
    Group("3", "mesh_tp", (0, 1)),
)


def _trace(path: Path, *, mapped: bool) -> Path:
    b = TraceBuilder(gpu=False, groups=GROUPS, world_size=4)
    b.profiler_step(1, 0.0, 100.0)
    b.gloo("all_reduce", 10.0, 10.0, nelems=1000, tid=121)
    b.gloo("all_reduce", 40.0, 20.0, nelems=2000, tid=112)
    trace = b.build()
    if mapped:
        trace = {TRACE_KEY: trace_fields({111: "1", 112: "1", 121: "3", 122: "3"}), **trace}
    path.write_text(json.dumps(trace))
    return path


def _collective_rows(out: str) -> list[list[str]]:
    lines = out.splitlines()
    start = next(i for i, line in enumerate(lines) if "collectives:" in line)
    return [line.split() for line in lines[start + 1 :] if line.strip()]


def test_unknown_group_size_prints_unknown(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["analyze", str(_trace(tmp_path / "t.json", mapped=False))]) == 0
    rows = _collective_rows(capsys.readouterr().out)
    # op, axis, tier, n, size (value unit), count, mean ms, busbw: n unknown, no busbw.
    assert [(r[0], r[1], r[3], r[-1]) for r in rows] == [
        ("all_reduce", "unknown", "unknown", "-")
    ] * 2


def test_a_kept_trace_and_the_users_axis_names(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    path = str(_trace(tmp_path / "t.json", mapped=True))
    assert main(["analyze", path]) == 0
    rows = _collective_rows(capsys.readouterr().out)
    assert sorted((r[1], r[3]) for r in rows) == [("dp", "2"), ("tp", "2")]
    monkeypatch.setenv("MFUSCOPE_AXIS_OVERRIDES", "mesh_dp=fsdp")
    assert main(["analyze", path]) == 0
    assert sorted(r[1] for r in _collective_rows(capsys.readouterr().out)) == ["fsdp", "tp"]
    assert main(["analyze", path, "--axis", "mesh_dp=replicas,3=rows"]) == 0  # the flag wins
    assert sorted(r[1] for r in _collective_rows(capsys.readouterr().out)) == ["replicas", "rows"]
    monkeypatch.setenv("MFUSCOPE_AXIS_OVERRIDES", "mesh_dp")
    assert main(["analyze", path]) == 2
    assert "MFUSCOPE_AXIS_OVERRIDES" in capsys.readouterr().err
