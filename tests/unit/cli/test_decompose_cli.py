"""`load_trace` errors and `mfuscope analyze` end to end in-process (exit codes, output)."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest
from mfuscope.cli import main
from mfuscope.core.trace import load_trace

from tests.support.trace_builder import Group, TraceBuilder


def _write_trace(path: Path, rank: int = 0, *, gz: bool = False) -> Path:
    b = TraceBuilder(rank=rank, world_size=2, groups=(Group("0", "default_pg", (0, 1)),))
    b.profiler_step(1, 0.0, 10.0)
    b.kernel(20.0, 50.0, launch_at=1.0)
    b.comm_kernel(60.0, 20.0, launch_at=2.0, nelems=1000)
    text = json.dumps(b.build())
    if gz:
        path.write_bytes(gzip.compress(text.encode()))
    else:
        path.write_text(text)
    return path


def test_load_trace_reads_plain_and_gzip(tmp_path: Path) -> None:
    plain = load_trace(_write_trace(tmp_path / "a.json"))
    zipped = load_trace(_write_trace(tmp_path / "b.json.gz", gz=True))
    assert plain == zipped and isinstance(plain["traceEvents"], list)


def test_analyze_prints_a_table_per_rank(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _write_trace(tmp_path / "rank1.json", rank=1)
    _write_trace(tmp_path / "rank0.json.gz", rank=0, gz=True)
    code = main(["analyze", str(tmp_path), "--model-flops-per-step", "3e9", "--peak-flops", "1e14"])
    out, err = capsys.readouterr()
    assert code == 0 and err == ""
    assert out.index("rank 0/2") < out.index("rank 1/2")
    # 60 µs window: compute 50 µs (83.3%), exposed comm 10 µs (16.7%); MFU 3e9/(1e14*60e-6).
    assert " 83.3% " in out and " 16.7% " in out and " 50.0% " in out
    assert "all_reduce" in out and "world" in out and "4.00 kB" in out


def test_analyze_json_is_one_document(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _write_trace(tmp_path / "r.json")
    assert main(["analyze", str(path), "--json", "--gpus-per-node", "1"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["schema"] == "mfuscope.analysis/1"
    (step,) = doc["ranks"][0]["steps"]
    assert step["wall_s"] == pytest.approx(60e-6)
    assert step["collectives"][0]["tier"] == "inter_node"


@pytest.mark.parametrize(
    ("setup", "message"),
    [
        (lambda d: d / "missing.json", "missing.json: no such file"),
        (lambda d: (d / "x.json").write_text("nope") and d / "x.json", "x.json: not JSON"),
        (
            lambda d: (d / "e.json").write_text('{"traceEvents": []}') and d / "e.json",
            "e.json: no activity on the timeline",
        ),
        (lambda d: (d / "sub").mkdir() or d / "sub", "sub: directory holds no .json"),
    ],
)
def test_bad_input_is_one_stderr_line_and_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], setup: object, message: str
) -> None:
    good = _write_trace(tmp_path / "good.json")
    bad = setup(tmp_path)  # type: ignore[operator]
    code = main(["analyze", str(good), str(bad)])
    out, err = capsys.readouterr()
    assert code == 2
    assert out == ""  # no partial output
    assert err.count("\n") == 1 and message in err and err.startswith("mfuscope analyze: ")


def test_analyze_warns_about_the_same_file_twice_and_still_answers(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _write_trace(tmp_path / "r.json")
    assert main(["analyze", str(path), str(path), "--json"]) == 0
    out, err = capsys.readouterr()
    (line,) = err.splitlines()
    assert line.startswith("mfuscope analyze: warning: ") and "the same trace" in line
    doc = json.loads(out)
    assert len(doc["ranks"]) == 2 and "the same trace" in doc["warnings"][0]


def test_analyze_chosen_windows_and_their_source(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _write_trace(tmp_path / "r.json")
    assert main(["analyze", str(path), "--json", "--window-range", "30:70"]) == 0
    (step,) = json.loads(capsys.readouterr().out)["ranks"][0]["steps"]
    assert step["window_source"] == "range" and step["wall_s"] == pytest.approx(40e-6)
    code = main(["analyze", str(path), "--window-annotation", "decode"])
    out, err = capsys.readouterr()
    assert code == 2 and out == "" and err.count("\n") == 1
    assert "window annotation 'decode': no such annotation" in err
    with pytest.raises(SystemExit):  # argparse: a range that ends before it starts
        main(["analyze", str(path), "--window-range", "70:30"])


def test_analyze_without_profiler_steps_says_it_took_the_whole_trace(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    b = TraceBuilder(world_size=1)
    b.kernel(20.0, 50.0, launch_at=1.0)
    path = tmp_path / "eager.json"
    path.write_text(json.dumps(b.build()))
    assert main(["analyze", str(path)]) == 0
    out, _ = capsys.readouterr()
    assert "windows: the whole trace as one window (no ProfilerStep#N in the trace)" in out
