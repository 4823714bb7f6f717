"""End-to-end speed of `mfuscope analyze` against a bare JSON parse of the same file.

For each trace (the real ones in ../shared/traces and a generated one of >= 2M events):
- floor: ``json.load`` of the file (through gzip for .gz), best of `--repeat` runs, GC as
  Python ships it; ``floor_nogc`` the same with the cyclic GC paused (what `load_trace` does);
- e2e: ``mfuscope analyze FILE --json`` run in-process (read, decompress, parse, analyse,
  render JSON to /dev/null), best of `--repeat` runs.
Printed: events/s end to end and the ratios e2e / floor (target: >= 1M events/s, <= 2x).

Run: ``.venv/bin/python benchmarks/analyze_bench.py [--events 2000000] [--repeat 1]``.
The machine is shared and noisy: compare ratios from the same run, and run it twice.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import gzip
import io
import json
import os
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
TRACES = ROOT / ".." / "shared" / "traces"
REAL = [
    TRACES / "hta_resnet_ddp_2xA100" / "nccl_data.json.gz",
    TRACES / "tracelens_resnet_actckpt_8xMI300X" / "resnet_act_checkpoint.json.gz",
]
sys.path.insert(0, str(ROOT / "tests" / "unit"))


def _best(fn: Callable[[], Any], repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        gc.collect()
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def _parse(path: Path) -> None:
    opener = gzip.open if path.name.endswith(".gz") else open
    with opener(path, "rb") as handle:
        json.load(handle)


def _parse_nogc(path: Path) -> None:
    gc.disable()
    try:
        _parse(path)
    finally:
        gc.enable()


def _analyze(path: Path) -> None:
    from mfuscope.cli import main

    with contextlib.redirect_stdout(io.StringIO()):
        code = main(["analyze", str(path), "--json"])
    assert code == 0, f"mfuscope analyze failed on {path}"


def _events(path: Path) -> int:
    opener = gzip.open if path.name.endswith(".gz") else open
    with opener(path, "rb") as handle:
        return len(json.load(handle)["traceEvents"])


def _generated(n_events: int, directory: Path) -> Path:
    from trace_builder import realistic_trace

    trace, count = realistic_trace(n_events)
    path = directory / f"generated_{count}_events.json"
    path.write_text(json.dumps(trace, separators=(",", ":")))
    return path


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=2_000_000, help="size of generated trace")
    parser.add_argument("--repeat", type=int, default=1, help="runs per measurement (best of)")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        started = time.perf_counter()
        generated = _generated(args.events, Path(tmp))
        print(f"generated {generated.name} in {time.perf_counter() - started:.1f} s", flush=True)
        header = (
            f"{'trace':<42} {'events':>9} {'MB':>7} {'floor s':>8} {'nogc s':>8} {'e2e s':>8}"
            f" {'Mev/s':>6} {'e2e/floor':>9} {'e2e/nogc':>8}"
        )
        print(header)
        for path in [*REAL, generated]:
            events = _events(path)
            floor = _best(lambda p=path: _parse(p), args.repeat)
            floor_nogc = _best(lambda p=path: _parse_nogc(p), args.repeat)
            e2e = _best(lambda p=path: _analyze(p), args.repeat)
            size_mb = os.path.getsize(path) / 1e6
            print(
                f"{path.name:<42} {events:>9} {size_mb:>7.1f} {floor:>8.3f} {floor_nogc:>8.3f}"
                f" {e2e:>8.3f} {events / e2e / 1e6:>6.2f} {e2e / floor:>9.2f}"
                f" {e2e / floor_nogc:>8.2f}",
                flush=True,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
