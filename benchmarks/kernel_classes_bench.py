"""What classifying kernels by name costs, beside `mfuscope analyze` of the same traces.

For each real trace (../shared/traces): its distinct kernel names, then, in one process and
alternating, best of `--repeat`:
- ``classify ms``: every distinct name through `kernel_classes` from cold caches (its class and
  whether it is communication), the work `analyze` does once per distinct name;
- ``e2e ms``: ``mfuscope analyze FILE --json`` in-process, the classifier's caches cleared first
  (so the e2e time includes the classification).
Printed: µs per distinct name and classification as a share of e2e. Also the committed list of
real names (tests/data/kernel_names.tsv), classified alone.

Run: ``.venv/bin/python benchmarks/kernel_classes_bench.py [--repeat 5]``. The machine is
shared and noisy: compare figures from the same run.
"""

from __future__ import annotations

import argparse
import gc
import gzip
import json
import sys
import time
from pathlib import Path

from _traces import REAL, ROOT, analyze_in_process, warm_up

COMMITTED = ROOT / "tests" / "data" / "kernel_names.tsv"


def _clear() -> None:
    from mfuscope.core.trace import kernel_classes

    for cached in (
        kernel_classes.kernel_family,
        kernel_classes.classify_kernel,
        kernel_classes.is_communication_kernel,
        kernel_classes._family_of_callee,
    ):
        cached.cache_clear()


def _classify(names: list[str]) -> float:
    from mfuscope.core.trace._kineto import is_comm_kernel
    from mfuscope.core.trace.kernel_classes import class_code

    _clear()
    gc.collect()
    start = time.perf_counter()
    for name in names:
        class_code(name)
        is_comm_kernel(name)
    return time.perf_counter() - start


def _e2e(path: Path) -> float:
    _clear()
    gc.collect()
    start = time.perf_counter()
    analyze_in_process(path)
    return time.perf_counter() - start


def _names(path: Path) -> list[str]:
    with gzip.open(path, "rb") as handle:
        events = json.load(handle)["traceEvents"]
    return sorted({e["name"] for e in events if e.get("cat") == "kernel"})


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5, help="runs per measurement (best of)")
    args = parser.parse_args()
    warm_up()
    print(
        f"{'trace':<32} {'names':>6} {'classify ms':>11} {'us/name':>8} {'e2e ms':>8} {'share':>7}"
    )
    for path in REAL:
        names = _names(path)
        classify = e2e = float("inf")
        for _ in range(args.repeat):
            classify = min(classify, _classify(names))
            e2e = min(e2e, _e2e(path))
        print(
            f"{path.name:<32} {len(names):>6} {classify * 1e3:>11.3f}"
            f" {classify / len(names) * 1e6:>8.1f} {e2e * 1e3:>8.1f} {classify / e2e:>7.1%}",
            flush=True,
        )
    committed = [
        line.split("\t")[2]
        for line in COMMITTED.read_text(encoding="utf-8").splitlines()
        if line and not line.startswith("#")
    ]
    best = min(_classify(committed) for _ in range(args.repeat))
    print(
        f"{COMMITTED.name:<32} {len(committed):>6} {best * 1e3:>11.3f}"
        f" {best / len(committed) * 1e6:>8.1f}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
