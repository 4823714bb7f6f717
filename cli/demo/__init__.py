"""`mfuscope demo`: a collector, a real 2-rank gloo training job with the agent, a live view, and a
report at the end. Ctrl-C stops everything it started.

Everything it writes goes to one directory (default `./mfuscope-demo-out/`, named at the end):
the agents' JSONL output (`agent/`), the report (`report/`), the collector's final `/v1/summary`
and `/metrics` (`summary.json`, `metrics.txt`) and the logs. Temporary files (the collector's
address file, Prometheus' config and data) live in a temporary directory removed on exit.
"""

from __future__ import annotations

import argparse
import shutil
import signal
import sys
from pathlib import Path

__all__ = ["DEFAULT_DURATION_S", "DEFAULT_OUT", "JOB", "OUTPUTS", "add_arguments", "run"]

DEFAULT_OUT = Path("mfuscope-demo-out")
# Training time, not a step count: the demo must take about a minute on a slow or busy machine
# too (start-up, ~10 s, and the report, a few s, come on top).
DEFAULT_DURATION_S = 40.0
DEFAULT_LISTEN = "127.0.0.1:9464"
JOB = "demo"
MARKER = ".mfuscope-demo"
# What a previous demo run leaves in its output directory, removed before a new run.
OUTPUTS = ("agent", "report", "summary.json", "metrics.txt", "train.log", "collector.log",
           "prometheus.log")  # fmt: skip


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add = parser.add_argument
    add("--steps", type=int, default=None, help="train this many steps (default: --duration)")
    add(
        "--duration",
        type=float,
        default=DEFAULT_DURATION_S,
        metavar="SECONDS",
        help=f"train for about this long (default {DEFAULT_DURATION_S:.0f} s; with start-up and "
        "the report the demo takes about a minute)",
    )
    add("--ranks", type=int, default=2, help="torchrun processes (default 2)")
    add("--pipeline", action="store_true", help="2-stage pipeline (pp axis) instead of pure DDP")
    add("--no-live", action="store_true", help="plain progress lines instead of the live view")
    add("--out", type=Path, default=DEFAULT_OUT, help=f"output directory (default {DEFAULT_OUT}/)")
    add(
        "--listen",
        default=None,
        metavar="HOST:PORT",
        help=f"collector address (default {DEFAULT_LISTEN}, or a free port if that is busy)",
    )
    add(
        "--prometheus",
        action="store_true",
        help="also run Prometheus with deploy/prometheus (rules included) scraping the collector",
    )
    add(
        "--prometheus-listen",
        default="127.0.0.1:9090",
        metavar="HOST:PORT",
        help="where Prometheus listens, with --prometheus (default 127.0.0.1:9090)",
    )
    add(
        "--hold",
        action="store_true",
        help="after training, keep the collector (and Prometheus) serving until Ctrl-C",
    )
    add("--no-report", action="store_true", help="skip the HTML report")


def _prepare_out(out: Path) -> None:
    if out.exists() and not (out / MARKER).exists() and any(out.iterdir()):
        raise ValueError(
            f"{out} exists and was not made by mfuscope demo; "
            "pass --out with a new or empty directory"
        )
    for name in OUTPUTS:
        path = out / name
        if path.is_dir():
            shutil.rmtree(path)
        elif path.exists():
            path.unlink()
    (out / "agent").mkdir(parents=True, exist_ok=True)
    (out / MARKER).write_text("written by `mfuscope demo`; safe to delete\n")


def run(args: argparse.Namespace) -> int:
    if (args.steps is not None and args.steps < 1) or args.ranks < 1 or not args.duration > 0:
        print("mfuscope demo: --steps, --ranks and --duration must be positive", file=sys.stderr)
        return 2
    if args.pipeline and args.ranks % 2:
        print("mfuscope demo: --pipeline needs an even number of --ranks", file=sys.stderr)
        return 2
    from mfuscope.cli.demo._summary import previous_peaks

    # The peaks of the run this one replaces, to say whether the two are against one peak.
    previous = previous_peaks(args.out) if (args.out / MARKER).exists() else ()
    try:
        _prepare_out(args.out)
    except (ValueError, OSError) as exc:
        print(f"mfuscope demo: {exc}", file=sys.stderr)
        return 2
    from mfuscope.cli.demo import _interrupt
    from mfuscope.cli.demo._run import DemoRun

    # SIGTERM and SIGHUP stop the demo exactly like Ctrl-C.
    restore = _interrupt.install()
    demo = DemoRun(args, JOB, DEFAULT_LISTEN, previous_peaks=previous)
    try:
        return demo.run()
    except KeyboardInterrupt:
        demo.interrupted = True
        return 130
    finally:
        # A second Ctrl-C must not cut the clean-up short and leave processes behind.
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        try:
            demo.close()
        finally:
            restore()
