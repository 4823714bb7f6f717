"""How long `mfuscope --help` takes against a bare Python start that imports argparse.

Both are fresh processes from this venv, run interleaved `--runs` times each; printed: the
median of each and their ratio (target: `mfuscope --help` within 3x of the bare start). The
top-level help imports no subcommand module (no numpy, no trace engine, no torch).

Run: ``.venv/bin/python benchmarks/cli_startup.py [--runs 21]``.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path


def _seconds(command: list[str]) -> float:
    start = time.perf_counter()
    subprocess.run(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
    return time.perf_counter() - start


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=21, help="fresh processes of each kind")
    args = parser.parse_args()
    bare = [sys.executable, "-c", "import argparse"]
    ours = [str(Path(sys.executable).parent / "mfuscope"), "--help"]
    bare_s: list[float] = []
    ours_s: list[float] = []
    for _ in range(args.runs):
        bare_s.append(_seconds(bare))
        ours_s.append(_seconds(ours))
    bare_median, ours_median = statistics.median(bare_s), statistics.median(ours_s)
    print(f"python -c 'import argparse': median {bare_median * 1e3:.1f} ms")
    print(f"mfuscope --help:             median {ours_median * 1e3:.1f} ms")
    print(f"ratio: {ours_median / bare_median:.2f}x (target <= 3x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
