"""The `mfuscope` dispatcher: the top-level help lists every subcommand without importing any of
them (that is what keeps `mfuscope --help` near a bare Python start; the timing itself is
`benchmarks/cli_startup.py`), and `analyze` starts without the costs it does not need (the
whole-process timing against HolisticTraceAnalysis is `benchmarks/hta_compare.py`)."""

from __future__ import annotations

import contextlib
import io
import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from mfuscope.cli import SUBCOMMANDS, main
from mfuscope.cli import analyze as analyze_cli
from mfuscope.core.trace.trace_io import ScannedTrace

from tests.support.trace_builder import Group, TraceBuilder

SCRIPT = """
import contextlib, io, sys
from mfuscope.cli import main
out = io.StringIO()
with contextlib.redirect_stdout(out):
    try:
        main(["--help"])
    except SystemExit as exit:
        code = exit.code
loaded = sorted(m for m in sys.modules if m.startswith("mfuscope.") and m != "mfuscope.cli")
heavy = sorted(m for m in ("numpy", "torch", "msgspec", "aiohttp") if m in sys.modules)
print(code, ",".join(loaded) or "-", ",".join(heavy) or "-")
print(out.getvalue())
"""


@pytest.mark.slow  # the CLI in a child process
def test_top_level_help_lists_every_subcommand_and_imports_none() -> None:
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=60, check=True
    )
    first, _, help_text = done.stdout.partition("\n")
    code, loaded, heavy = first.split()
    assert code == "0"
    assert loaded == "-", f"the top-level help imported {loaded}"
    assert heavy == "-", f"the top-level help imported {heavy}"
    for name, (_, help_line) in SUBCOMMANDS.items():
        assert name in help_text
        assert help_line.split()[0] in help_text


ANALYZE_SCRIPT = """
import contextlib, gc, io, json, os, sys
from mfuscope.cli import main
with contextlib.redirect_stdout(io.StringIO()):
    code = main(["analyze", sys.argv[1], "--json"])
print(json.dumps({
    "code": code,
    "blas_threads": os.environ.get("OPENBLAS_NUM_THREADS"),
    "gc_enabled": gc.isenabled(),
    "masked_arrays": "numpy.ma" in sys.modules,
}))
"""


def _analyze_in_fresh_process(trace: Path, env: dict[str, str]) -> dict[str, object]:
    done = subprocess.run(
        [sys.executable, "-c", ANALYZE_SCRIPT, str(trace)],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
        env=env,
    )
    result: dict[str, object] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


@pytest.mark.slow  # the CLI in a child process
def test_analyze_starts_without_blas_threads_masked_arrays_or_gc_left_off(tmp_path: Path) -> None:
    b = TraceBuilder(rank=0, world_size=2, groups=(Group("0", "default_pg", (0, 1)),))
    b.profiler_step(1, 0.0, 10.0)
    b.kernel(20.0, 50.0, launch_at=1.0)
    b.kernel(30.0, 60.0, launch_at=1.5)  # overlapping compute: the interval union runs
    b.comm_kernel(60.0, 40.0, launch_at=2.0, nelems=1000)  # partly exposed: a subtraction runs
    trace = tmp_path / "rank0.json"
    trace.write_text(json.dumps(b.build()))
    env = {k: v for k, v in os.environ.items() if k != "OPENBLAS_NUM_THREADS"}

    result = _analyze_in_fresh_process(trace, env)
    assert result == {
        "code": 0,
        "blas_threads": "1",  # analyze calls no BLAS: no thread pool started at numpy's import
        "gc_enabled": True,  # paused while the modules load, then back on
        "masked_arrays": False,  # np.unique would import numpy.ma (~15 ms)
    }
    # A user's own choice of BLAS threads stands.
    assert (
        _analyze_in_fresh_process(trace, {**env, "OPENBLAS_NUM_THREADS": "3"})["blas_threads"]
        == "3"
    )


def _small_trace(tmp_path: Path) -> Path:
    b = TraceBuilder(rank=0, world_size=2, groups=(Group("0", "default_pg", (0, 1)),))
    b.profiler_step(1, 0.0, 10.0)
    b.kernel(20.0, 50.0, launch_at=1.0)
    b.comm_kernel(60.0, 40.0, launch_at=2.0, nelems=1000)
    trace = tmp_path / "rank0.json"
    trace.write_text(json.dumps(b.build()))
    return trace


def test_the_first_trace_is_scanned_while_the_engine_imports(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each side waits for the other: the import has begun before the scan ends, and the scan
    ends before the import does. Either done after the other times out and fails."""
    trace = _small_trace(tmp_path)
    importing, scanned = threading.Event(), threading.Event()
    waits: dict[str, bool] = {}
    real_import, real_scan = analyze_cli._import_engine, analyze_cli.scan_trace

    def import_engine() -> None:
        importing.set()
        waits["import saw the scan end"] = scanned.wait(timeout=10)
        real_import()

    def scan_trace(path: Path, *, max_bytes: int) -> ScannedTrace:
        waits["scan saw the import begin"] = importing.wait(timeout=10)
        result = real_scan(path, max_bytes=max_bytes)
        scanned.set()
        return result

    monkeypatch.setattr(analyze_cli, "_import_engine", import_engine)
    monkeypatch.setattr(analyze_cli, "scan_trace", scan_trace)
    with contextlib.redirect_stdout(io.StringIO()):
        assert main(["analyze", str(trace), "--json"]) == 0
    assert waits == {"import saw the scan end": True, "scan saw the import begin": True}


SCAN_SCRIPT = """
import sys
from mfuscope.cli import analyze
from mfuscope.core.trace.trace_io import scan_trace
scan_trace(sys.argv[1])
engine = [m for m in analyze._ENGINE_MODULES if m in sys.modules]
print(" ".join(m for m in ("numpy", *engine) if m in sys.modules) or "-")
"""


@pytest.mark.slow  # the CLI in a child process
def test_analyze_reads_and_scans_a_trace_without_importing_numpy(tmp_path: Path) -> None:
    """What the main thread runs while the engine imports: were it to import numpy, it would
    wait on the import lock for the engine's thread and the overlap would be gone."""
    done = subprocess.run(
        [sys.executable, "-c", SCAN_SCRIPT, str(_small_trace(tmp_path))],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert done.stdout.strip() == "-"


def _fresh_python(script: str, env: dict[str, str] | None = None) -> str:
    """What `script` prints in a fresh interpreter (a module imported by a test stays loaded)."""
    done = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
        env=env,
    )
    return done.stdout


PARSER_SCRIPT = """
import sys
from mfuscope.cli import build_parser
parser = build_parser("analyze")
print("shutil" in sys.modules)
parser.print_help()
"""


@pytest.mark.slow  # the CLI in a child process
def test_analyze_builds_its_parser_without_shutil_and_help_still_fits_the_terminal() -> None:
    """argparse's default formatter imports shutil (and bz2, lzma) at every `add_argument`
    for a width only help needs; the help printed afterwards still wraps at the terminal's."""
    widest: dict[int, int] = {}
    for columns in (50, 140):
        output = _fresh_python(PARSER_SCRIPT, env={**os.environ, "COLUMNS": str(columns)})
        first, *help_lines = output.splitlines()
        assert first == "False"
        widest[columns] = max(map(len, help_lines))
    assert widest[50] <= 48 < widest[140] <= 138


ENGINE_SCRIPT = """
import sys
from mfuscope.cli import analyze
analyze._import_engine()
print("dataclasses" in sys.modules, "mfuscope.core.trace.decompose" in sys.modules)
"""


@pytest.mark.slow  # the CLI in a child process
def test_analyze_loads_its_engine_without_making_a_dataclass() -> None:
    """Every record on analyze's path is a msgspec Struct: a frozen dataclass costs 0.5-1.4 ms
    to create at import (its generated methods are compiled one by one), a Struct ~0.02 ms."""
    assert _fresh_python(ENGINE_SCRIPT).split() == ["False", "True"]


EXIT_SCRIPT = """
import atexit, sys
from mfuscope.cli import console_main
if sys.argv[1] == "hook":
    atexit.register(print, "exit hook ran", file=sys.stderr)
sys.argv = ["mfuscope", "analyze", sys.argv[2], "--json"]
console_main()
"""


@pytest.mark.slow  # the CLI in a child process
def test_analyze_exits_with_its_output_flushed_and_exit_hooks_run(tmp_path: Path) -> None:
    trace = _small_trace(tmp_path)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["analyze", str(trace), "--json"]) == 0
    for hook in ("none", "hook"):
        done = subprocess.run(
            [sys.executable, "-c", EXIT_SCRIPT, hook, str(trace)],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert (done.returncode, done.stdout) == (0, out.getvalue())
        assert ("exit hook ran" in done.stderr) == (hook == "hook")
    missing = subprocess.run(
        [sys.executable, "-m", "mfuscope.cli", "analyze", str(tmp_path / "missing.json")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert (missing.returncode, missing.stdout) == (2, "")
    assert "missing.json: no such file" in missing.stderr


def _hide_module(monkeypatch: pytest.MonkeyPatch, hidden: str) -> None:
    """Make importing `hidden` (and the subcommand that needs it) fail as an absent module."""
    import importlib

    real = importlib.import_module

    def fake(name: str, package: str | None = None) -> object:
        if name == hidden or name.startswith(hidden + "."):
            raise ModuleNotFoundError(f"No module named {hidden!r}", name=hidden)
        if name == "mfuscope.cli.report" and hidden != name:
            raise ModuleNotFoundError(f"No module named {hidden!r}", name=hidden)
        return real(name, package)

    monkeypatch.setattr(importlib, "import_module", fake)


def test_a_subcommand_missing_from_the_install_is_an_error_naming_its_module(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # A wheel once left mfuscope.cli.validate_gpu out and the command silently vanished.
    _hide_module(monkeypatch, "mfuscope.cli.report")
    assert main(["report", "x.jsonl"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (
        "mfuscope report: this installation lacks the module mfuscope.cli.report "
        "(a broken install: reinstall mfuscope)"
    )


def test_a_subcommand_whose_dependency_is_missing_names_it_and_the_extra(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _hide_module(monkeypatch, "matplotlib")
    assert main(["report", "x.jsonl"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (
        "mfuscope report: needs the Python module 'matplotlib', which is not installed: "
        "pip install 'mfuscope[report]'"
    )
    assert "\n" not in err
