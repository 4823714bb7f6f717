"""End-to-end speed of `mfuscope analyze` against a bare JSON parse of the same file.

For each trace (the real ones in ../shared/traces and a generated one of >= 2M events), best
of `--repeat` runs each, all reading the file (through gzip for .gz):
- ``json s`` (the floor): a bare standard-library ``json.load``, GC as Python ships
  it; ``nogc s`` the same with the cyclic GC paused;
- ``msgspec s``: a bare ``msgspec.json.decode`` of the file (the library the engine decodes
  with) into plain dicts and lists, GC paused: the same parse with the chosen library;
- ``decode s``: `read_trace` alone (events the analysis never reads left out by the C scanner,
  then msgspec into the engine's event model, unread keys skipped): the part of the
  end-to-end time that is reading and parsing;
- ``e2e s``: ``mfuscope analyze FILE --json`` run in-process (read, decompress, decode,
  analyse, render JSON to a buffer).
Printed: events/s end to end and e2e over each of the parses (target: >= 1M events/s end to
end and e2e within 2x of the ``json.load`` floor).

``--tricks N``: what each speed trick of `mfuscope analyze` buys, whole-process (interpreter
start and imports included, output to /dev/null, as a user runs it): N fresh processes of each
variant, interleaved, on each trace, the median of each and its ratio to the shipped command.
Each variant switches one trick off from outside the product (a wrapper that patches before
calling the console entry point; the shipped variant goes through the same wrapper):
- ``no C selection``: the compiled event pre-filter hidden (the pure-Python decode of every
  event, what an install without a C compiler runs);
- ``GC on``: the cyclic GC left running while the subcommand's modules are imported;
- ``teardown``: the normal interpreter exit instead of ``os._exit`` once the output is flushed.
A trick stays only where this shows what it buys (its figure is quoted next to it).

Run: ``.venv/bin/python benchmarks/analyze_bench.py [--events 2000000] [--repeat 1]
[--tricks 15]``. The machine is shared and noisy: compare ratios from the same run, and run it
twice.
"""

from __future__ import annotations

import argparse
import gc
import gzip
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from _traces import REAL, analyze_in_process, warm_up, write_generated


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


def _paused_gc(fn: Callable[[Path], Any]) -> Callable[[Path], None]:
    def run(path: Path) -> None:
        gc.disable()
        try:
            fn(path)
        finally:
            gc.enable()

    return run


def _msgspec_parse(path: Path) -> None:
    import msgspec

    opener = gzip.open if path.name.endswith(".gz") else open
    with opener(path, "rb") as handle:
        msgspec.json.decode(handle.read())


def _decode(path: Path) -> None:
    from mfuscope.core.trace import read_trace

    read_trace(path)


def _gunzip_name() -> str:
    from mfuscope.core.trace import trace_io

    inflater = trace_io._decompressobj
    return f"{inflater.__module__}.{inflater.__name__}"


def _events(path: Path) -> int:
    opener = gzip.open if path.name.endswith(".gz") else open
    with opener(path, "rb") as handle:
        return len(json.load(handle)["traceEvents"])


# Runs `mfuscope ARGS` with one trick switched off: argv is VARIANT, then the subcommand's words.
_VARIANT_RUN = """
import sys
variant, sys.argv = sys.argv[1], ["mfuscope", *sys.argv[2:]]
if variant == "no C selection":
    sys.modules["mfuscope.core.trace._select_c"] = None  # importing it fails: decode everything
import mfuscope.cli as cli
if variant == "GC on":
    class _KeptOn:
        isenabled = staticmethod(lambda: True)
        disable = enable = staticmethod(lambda: None)
    cli.gc = _KeptOn
elif variant == "teardown":
    cli._exit_without_teardown = lambda code: None
cli.console_main()
"""
VARIANTS = ("shipped", "no C selection", "GC on", "teardown")


def _one_process(variant: str, path: Path) -> float:
    started = time.perf_counter()
    subprocess.run(
        [sys.executable, "-c", _VARIANT_RUN, variant, "analyze", str(path), "--json"],
        stdout=subprocess.DEVNULL,
        check=True,
    )
    return time.perf_counter() - started


def tricks(paths: list[Path], processes: int) -> None:
    """The whole-process table of `--tricks` (module docstring)."""
    print(f"\nwhole process, median of {processes} interleaved runs; ratio = variant / shipped")
    print(f"{'trace':<32} " + " ".join(f"{v:>22}" for v in VARIANTS))
    for path in paths:
        times: dict[str, list[float]] = {v: [] for v in VARIANTS}
        for _ in range(processes):
            for variant in VARIANTS:
                times[variant].append(_one_process(variant, path))
        shipped = statistics.median(times["shipped"])
        cells = [
            f"{statistics.median(t):>7.3f} s ({statistics.median(t) / shipped:>5.3f}x)"
            for t in times.values()
        ]
        print(f"{path.name:<32} " + " ".join(f"{c:>22}" for c in cells), flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=2_000_000, help="size of generated trace")
    parser.add_argument("--repeat", type=int, default=1, help="runs per measurement (best of)")
    parser.add_argument(
        "--tricks", type=int, default=0, help="whole-process runs per variant (0: skip)"
    )
    args = parser.parse_args()
    warm_up()
    from mfuscope.core.trace._select import SELECTION_AVAILABLE

    with tempfile.TemporaryDirectory() as tmp:
        started = time.perf_counter()
        generated = write_generated(args.events, Path(tmp))
        print(f"generated {generated.name} in {time.perf_counter() - started:.1f} s", flush=True)
        print("floor = json s: a bare stdlib json.load of the same file, measured in this run")
        print(f"C event selection built: {SELECTION_AVAILABLE}; gunzip: {_gunzip_name()}")
        header = (
            f"{'trace':<32} {'events':>8} {'MB':>6} {'json s':>7} {'nogc s':>7}"
            f" {'msgspec s':>9} {'decode s':>8} {'e2e s':>7} {'Mev/s':>6} {'e2e/json':>8}"
            f" {'e2e/msgspec':>11} {'e2e/decode':>10}"
        )
        print(header)
        for path in [*REAL, generated]:
            events = _events(path)
            floor = _best(lambda p=path: _parse(p), args.repeat)
            floor_nogc = _best(lambda p=path: _paused_gc(_parse)(p), args.repeat)
            bare = _best(lambda p=path: _paused_gc(_msgspec_parse)(p), args.repeat)
            decode = _best(lambda p=path: _decode(p), args.repeat)
            e2e = _best(lambda p=path: analyze_in_process(p), args.repeat)
            size_mb = os.path.getsize(path) / 1e6
            print(
                f"{path.name:<32} {events:>8} {size_mb:>6.1f} {floor:>7.3f} {floor_nogc:>7.3f}"
                f" {bare:>9.3f} {decode:>8.3f} {e2e:>7.3f} {events / e2e / 1e6:>6.2f}"
                f" {e2e / floor:>8.2f} {e2e / bare:>11.2f} {e2e / decode:>10.2f}",
                flush=True,
            )
        if args.tricks:
            tricks([*REAL, generated], args.tricks)
    return 0


if __name__ == "__main__":
    sys.exit(main())
