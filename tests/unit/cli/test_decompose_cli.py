"""`load_trace` errors and `mfuscope analyze` end to end in-process (exit codes, output)."""

from __future__ import annotations

import gzip
import json
import math
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from mfuscope.cli import main
from mfuscope.core.trace import load_trace, to_json

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


# --- hostile traces: one line on stderr, exit 2, nothing on stdout ------------------------------


def _events_where(doc: dict[str, Any], cat: str, name_part: str = "") -> list[dict[str, Any]]:
    return [
        e
        for e in doc["traceEvents"]
        if e.get("ph") == "X" and e.get("cat") == cat and name_part in e.get("name", "")
    ]


def _mutated(path: Path, change: Callable[[dict[str, Any]], None]) -> Path:
    doc = json.loads(_write_trace(path).read_text())
    change(doc)
    path.write_text(json.dumps(doc))
    return path


def _negative_nccl_dur(doc: dict[str, Any]) -> None:
    _events_where(doc, "kernel", "nccl")[0]["dur"] = -20.0


def _negative_kernel_ts(doc: dict[str, Any]) -> None:
    _events_where(doc, "kernel")[0]["ts"] = -5.0


def _absurd_dur(doc: dict[str, Any]) -> None:
    _events_where(doc, "kernel")[0]["dur"] = 1e308


def _absurd_operator_dur(doc: dict[str, Any]) -> None:
    _events_where(doc, "user_annotation", "ProfilerStep")[0]["dur"] = -1.0


def _analyze_fails(
    capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> tuple[str, str]:
    code = main(["analyze", *argv])
    out, err = capsys.readouterr()
    assert (code, out) == (2, "")
    assert err.count("\n") == 1 and err.startswith("mfuscope analyze: "), err
    assert message in err, err
    return out, err


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (_negative_nccl_dur, "impossible dur -20.0 us"),
        (_negative_kernel_ts, "impossible ts -5.0 us"),
        (_absurd_dur, "impossible dur 1e+308 us"),
        (_absurd_operator_dur, "'ProfilerStep#1': impossible dur -1.0 us"),
    ],
)
def test_impossible_timings_name_the_event_and_the_file(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    change: Callable[[dict[str, Any]], None],
    message: str,
) -> None:
    bad = _mutated(tmp_path / "bad.json", change)
    _, err = _analyze_fails(capsys, [str(bad)], message)
    assert "bad.json: " in err


def test_a_gzip_bomb_is_refused_at_the_decompression_cap(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bomb = tmp_path / "bomb.json.gz"
    bomb.write_bytes(gzip.compress(b'{"traceEvents": [' + b" " * (4 << 20) + b"]}"))
    assert bomb.stat().st_size < 20_000
    _analyze_fails(
        capsys, [str(bomb), "--max-trace-bytes", str(1 << 20)], "inflates to more than 1048576"
    )
    good = _write_trace(tmp_path / "good.json.gz", gz=True)
    assert main(["analyze", str(good), "--max-trace-bytes", str(1 << 20)]) == 0


def test_a_plain_trace_over_the_cap_and_gzip_garbage_are_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    good = _write_trace(tmp_path / "good.json")
    _analyze_fails(capsys, [str(good), "--max-trace-bytes", "100"], "larger than 100 bytes")
    zipped = _write_trace(tmp_path / "z.json.gz", gz=True)
    zipped.write_bytes(zipped.read_bytes() + b"trailing garbage")
    _analyze_fails(capsys, [str(zipped)], "garbage after the last member")
    two_members = tmp_path / "two.json.gz"
    text = good.read_bytes()
    two_members.write_bytes(gzip.compress(text[:10]) + gzip.compress(text[10:]))
    assert main(["analyze", str(two_members)]) == 0  # concatenated members are valid gzip


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs FIFOs")
def test_a_fifo_is_refused_without_blocking(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    fifo = tmp_path / "x.json"
    os.mkfifo(fifo)
    _analyze_fails(capsys, [str(fifo)], "x.json: not a regular file")


def test_absurd_flop_flags_are_refused_without_a_traceback(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    good = _write_trace(tmp_path / "good.json")
    argv = ["analyze", str(good), "--model-flops-per-step", "1e308", "--peak-flops", "1e-300"]
    with pytest.raises(SystemExit) as info:
        main([*argv, "--json"])
    out, err = capsys.readouterr()
    assert (info.value.code, out) == (2, "")
    assert "--model-flops-per-step" in err and "Traceback" not in err


def test_a_non_finite_result_is_an_error_not_a_traceback(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    good = _write_trace(tmp_path / "good.json")
    real = to_json.analysis_to_json

    def overflowing(ranks: Any, warnings: Any = ()) -> Any:
        doc = real(ranks, warnings)
        doc["ranks"][0]["steps"][0]["mfu"] = math.inf  # what absurd inputs could once produce
        return doc

    # analyze imports the engine after its first trace is scanned: patch it where it lives
    monkeypatch.setattr(to_json, "analysis_to_json", overflowing)
    _analyze_fails(capsys, [str(good), "--json"], "not a finite number")
