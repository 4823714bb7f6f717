"""`mfuscope analyze` against HolisticTraceAnalysis (HTA) on the same trace files.

HTA's closest analyses to ours are its temporal breakdown (idle / compute / non-compute time
per rank) plus its communication-computation overlap; we time both, after its trace parse,
in a side virtualenv (HTA pins pandas and friends that the project does not use), against
`mfuscope analyze FILE --json` in-process here (read, gunzip, select, decode, analyse,
render). Best of `--repeat` each, in this run. Also whole-process: a fresh ``mfuscope analyze
FILE --json`` process (interpreter start and imports included, output to /dev/null) against a
fresh HTA process (its import, parse, temporal breakdown and overlap). The aim: at least 10x
faster than HTA, whole-process, on the real ~25 MB trace.

Run: ``.venv/bin/python benchmarks/hta_compare.py [--hta-venv DIR] [--repeat 3]
[--generated N]``. The side venv is created with ``pip install HolisticTraceAnalysis`` if
DIR does not exist yet (default: ``~/.cache/mfuscope/hta-venv``); nothing of HTA is committed
or imported here.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _traces import REAL, analyze_in_process, warm_up, write_generated

# Runs inside the HTA venv: prints {"seconds": best, "error": null} as JSON on its last line.
_HTA_RUN = """
import json, logging, sys, time
logging.disable(logging.WARNING)
from hta.trace_analysis import TraceAnalysis
path, repeat = sys.argv[1], int(sys.argv[2])
best, error = None, None
for _ in range(repeat):
    start = time.perf_counter()
    try:
        analysis = TraceAnalysis(trace_files={0: path}, trace_dir="/")
        analysis.get_temporal_breakdown(visualize=False)
        analysis.get_comm_comp_overlap(visualize=False)
    except Exception as exc:
        error = f"{type(exc).__name__}: {exc}"[:200]
        break
    elapsed = time.perf_counter() - start
    best = elapsed if best is None else min(best, elapsed)
print(json.dumps({"seconds": best, "error": error}))
"""


def _hta_python(venv: Path) -> Path:
    python = venv / "bin" / "python"
    if not python.exists():
        print(f"creating {venv} and installing HolisticTraceAnalysis ...", flush=True)
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        subprocess.run(
            [str(python), "-m", "pip", "install", "-q", "HolisticTraceAnalysis"], check=True
        )
    return python


def _hta_seconds(python: Path, trace: Path, repeat: int) -> tuple[float | None, str | None]:
    done = subprocess.run(
        [str(python), "-c", _HTA_RUN, str(trace), str(repeat)],
        capture_output=True,
        text=True,
        timeout=3600,
    )
    if done.returncode != 0:
        return None, done.stderr.strip().splitlines()[-1][:200] if done.stderr else "failed"
    result = json.loads(done.stdout.strip().splitlines()[-1])
    return result["seconds"], result["error"]


def _process_seconds(command: list[str], repeat: int) -> float | None:
    """Best wall time of `repeat` fresh processes; None when the command fails."""
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        done = subprocess.run(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        elapsed = time.perf_counter() - start
        if done.returncode != 0:
            return None
        best = min(best, elapsed)
    return best


def _ours_seconds(trace: Path, repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        analyze_in_process(trace)
        best = min(best, time.perf_counter() - start)
    return best


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--hta-venv", type=Path, default=Path.home() / ".cache" / "mfuscope" / "hta-venv"
    )
    parser.add_argument("--repeat", type=int, default=3, help="runs per measurement (best of)")
    parser.add_argument(
        "--generated", type=int, default=0, help="also a generated trace of this many events"
    )
    args = parser.parse_args()
    warm_up()
    python = _hta_python(args.hta_venv)

    with tempfile.TemporaryDirectory() as tmp:
        traces = list(REAL)
        if args.generated:
            traces.append(write_generated(args.generated, Path(tmp)))
        mfuscope = Path(sys.executable).parent / "mfuscope"
        print(
            f"{'trace':<32} {'ours s':>8} {'HTA s':>8} {'ratio':>6}"
            f" | whole process: {'ours s':>8} {'HTA s':>8} {'ratio':>6}"
        )
        for path in traces:
            ours = _ours_seconds(path, args.repeat)
            hta, error = _hta_seconds(python, path, args.repeat)
            if hta is None:
                print(f"{path.name:<32} {ours:>8.3f} {'-':>8} {'-':>6}  HTA failed: {error}")
                continue
            ours_proc = _process_seconds([str(mfuscope), "analyze", str(path), "--json"], 3)
            hta_proc = _process_seconds([str(python), "-c", _HTA_RUN, str(path), "1"], 3)
            whole = (
                f"{ours_proc:>8.3f} {hta_proc:>8.3f} {hta_proc / ours_proc:>6.1f}"
                if ours_proc and hta_proc
                else "failed"
            )
            print(
                f"{path.name:<32} {ours:>8.3f} {hta:>8.3f} {hta / ours:>6.1f}"
                f" | whole process: {whole}",
                flush=True,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
