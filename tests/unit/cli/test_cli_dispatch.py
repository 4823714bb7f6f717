"""The `mfuscope` dispatcher: the top-level help lists every subcommand without importing any of
them (that is what keeps `mfuscope --help` near a bare Python start; the timing itself is
`benchmarks/cli_startup.py`), and `analyze` starts without the costs it does not need (the
whole-process timing against HolisticTraceAnalysis is `benchmarks/hta_compare.py`)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from mfuscope.cli import SUBCOMMANDS

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
