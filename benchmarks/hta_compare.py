"""`mfuscope analyze` against HolisticTraceAnalysis (HTA) on the same trace files.

HTA's closest analyses to ours are its temporal breakdown (idle / compute / non-compute time
per rank) plus its communication-computation overlap; we time both, after its trace parse,
in a side virtualenv (HTA pins pandas and friends that the project does not use), against
`mfuscope analyze FILE --json` in-process here (read, gunzip, select, decode, analyse,
render). Best of `--repeat` each, in this run.

Also whole-process, what a user waits for: fresh ``mfuscope analyze FILE --json`` processes
(interpreter start and imports included, output to /dev/null) against fresh HTA processes (its
import, parse, temporal breakdown and overlap), interleaved, `--processes` of each; printed:
the median and the min of each, and the ratio of the medians. Ours runs twice: as installed
from a wheel built from this checkout (what ``pip install mfuscope`` gives: HTA is installed
from its wheel too) and as the editable dev install of ``.venv`` (its import hook, set up by
``site`` at every start, costs ~15 ms that no user install has). The aim: at least 10x faster
than HTA, whole-process, on the real ~25 MB trace.

Run: ``.venv/bin/python benchmarks/hta_compare.py [--hta-venv DIR] [--repeat 3]
[--processes 11] [--generated N]``. The side venv is created with ``pip install
HolisticTraceAnalysis`` if DIR does not exist yet (default: ``~/.cache/mfuscope/hta-venv``);
nothing of HTA is committed or imported here. The wheel is built (``pip wheel --no-deps``, the
C extension included) and installed without dependencies into a temporary venv that finds its
dependencies (numpy, msgspec, ...) in this venv's site-packages.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

from _traces import REAL, ROOT, analyze_in_process, warm_up, write_generated

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


def _wheel_python(directory: Path) -> Path:
    """A venv in `directory` with mfuscope installed from a wheel of this checkout, its
    dependencies found in this venv's site-packages (no network, no editable import hook)."""
    wheels, venv = directory / "wheel", directory / "venv"
    pip = [sys.executable, "-m", "pip", "-q", "--disable-pip-version-check"]
    subprocess.run(
        [*pip, "wheel", "--no-deps", "--no-build-isolation", "-w", str(wheels), str(ROOT)],
        check=True,
        stdout=subprocess.DEVNULL,
    )
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    site_packages = Path(
        subprocess.run(
            [str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
            check=True,
            capture_output=True,
            text=True,
        ).stdout.strip()
    )
    (wheel,) = wheels.glob("mfuscope-*.whl")
    subprocess.run(
        [*pip, "install", "--no-deps", "--target", str(site_packages), str(wheel)], check=True
    )
    ours = Path(sysconfig.get_path("purelib"))
    (site_packages / "_mfuscope_dependencies.pth").write_text(f"{ours}\n")
    return python


def _process_seconds(commands: dict[str, list[str]], runs: int) -> dict[str, list[float]]:
    """Wall seconds of `runs` fresh processes of each command, interleaved (so that a busy
    spell of the machine lands on all of them); a failing command has no times."""
    seconds: dict[str, list[float]] = {name: [] for name in commands}
    failed: set[str] = set()
    for _ in range(runs):
        for name, command in commands.items():
            if name in failed:
                continue
            start = time.perf_counter()
            done = subprocess.run(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            if done.returncode != 0:
                failed.add(name)
                seconds[name] = []
                continue
            seconds[name].append(time.perf_counter() - start)
    return seconds


def _spread(times: list[float]) -> str:
    if not times:
        return f"{'failed':>17}"
    return f"{statistics.median(times):>8.3f} {min(times):>8.3f}"


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
    parser.add_argument("--repeat", type=int, default=3, help="in-process runs (best of)")
    parser.add_argument(
        "--processes", type=int, default=11, help="fresh processes of each (median, min)"
    )
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
        installed = _wheel_python(Path(tmp))
        editable = Path(sys.executable).parent / "mfuscope"
        print(f"{'in-process, best of':<32} {'ours s':>8} {'HTA s':>8} {'ratio':>6}")
        whole: list[str] = []
        for path in traces:
            ours = _ours_seconds(path, args.repeat)
            hta, error = _hta_seconds(python, path, args.repeat)
            if hta is None:
                print(f"{path.name:<32} {ours:>8.3f} {'-':>8} {'-':>6}  HTA failed: {error}")
                continue
            print(f"{path.name:<32} {ours:>8.3f} {hta:>8.3f} {hta / ours:>6.1f}", flush=True)
            analyze = ["analyze", str(path), "--json"]
            commands = {
                "wheel": [str(installed), "-m", "mfuscope.cli", *analyze],
                "editable": [str(editable), *analyze],
                "hta": [str(python), "-c", _HTA_RUN, str(path), "1"],
            }
            seconds = _process_seconds(commands, args.processes)
            line = f"{path.name:<32} " + " | ".join(_spread(seconds[name]) for name in commands)
            hta_median = statistics.median(seconds["hta"]) if seconds["hta"] else None
            for name in ("wheel", "editable"):
                if hta_median and seconds[name]:
                    line += f" | {name} {hta_median / statistics.median(seconds[name]):.1f}x"
            whole.append(line)
        print(
            f"\nwhole process, {args.processes} interleaved runs each, seconds (median min):"
            f"\n{'trace':<32} {'ours (wheel)':>17} | {'ours (editable)':>17} | {'HTA':>17}"
            " | HTA median / ours median"
        )
        print("\n".join(whole))
    return 0


if __name__ == "__main__":
    sys.exit(main())
