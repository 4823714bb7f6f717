"""`mfuscope compare BASELINE CANDIDATE`: two runs side by side, with deltas, and a CI gate.

Each side is Kineto traces (a file or a directory of ranks), agent output (a directory of the
agents' JSONL) or a collector summary (the JSON of ``GET /v1/summary``); docs/compare.md. Traces
are decomposed exactly as `mfuscope analyze` does, once per side, and every figure comes from the
report's aggregates, so compare never defines a quantity of its own.

Exit codes: 0, or 3 when ``--max-regression PCT`` is given and the candidate is worse by more than
PCT percent (MFU when both sides know it, else mean step time); 2 on bad input or when nothing
compares (one line on stderr, no traceback).
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

from mfuscope.cli.report import add_trace_arguments, trace_options

__all__ = ["EXIT_BAD_INPUT", "EXIT_REGRESSION", "add_arguments", "run"]

EXIT_BAD_INPUT = 2
EXIT_REGRESSION = 3


def _percent(text: str) -> float:
    try:
        value = float(text.rstrip("%"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a percentage, got {text!r}") from None
    if not (math.isfinite(value) and 0 <= value < 1e6):
        raise argparse.ArgumentTypeError(f"expected a percentage >= 0, got {text!r}")
    return value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    for name in ("baseline", "candidate"):
        parser.add_argument(
            name,
            type=Path,
            metavar=name.upper(),
            help=f"the {name}: a trace file or directory of ranks, a directory of agent JSONL "
            "output, or a collector summary (JSON of GET /v1/summary)",
        )
    parser.add_argument(
        "--max-regression",
        type=_percent,
        default=None,
        metavar="PCT",
        help="exit 3 when the candidate is worse by more than PCT percent (MFU when both sides "
        "have FLOPs, else mean step time)",
    )
    parser.add_argument("--json", action="store_true", help="print mfuscope.compare/1 JSON")
    parser.add_argument(
        "--html",
        type=Path,
        default=None,
        metavar="DIR",
        help="also write DIR/compare.html: the deltas and the report's plots of both sides",
    )
    parser.add_argument("--job", default=None, help="job to compare when an input holds several")
    add_trace_arguments(
        parser, "trace input (as for mfuscope analyze; both sides)", "for MFU and the waterfall"
    )


def run(args: argparse.Namespace) -> int:
    from mfuscope.cli.compare._render import render_json, render_text
    from mfuscope.cli.compare._sides import load_side
    from mfuscope.core.errors import InputError, TraceError
    from mfuscope.core.run_summary.comparison import comparable, compare

    options = trace_options(args)
    paths = (str(args.baseline), str(args.candidate))
    try:
        if args.gpus_per_node is not None and args.gpus_per_node < 1:
            raise ValueError("--gpus-per-node must be >= 1")
        sides = [load_side(path, args.job, options) for path in (args.baseline, args.candidate)]
    except TraceError as exc:
        print(f"mfuscope compare: {exc.path or 'trace'}: {exc.message}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except (InputError, ValueError, OSError) as exc:
        print(f"mfuscope compare: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    base, cand = (side.profile for side in sides)
    why_not = comparable(base, cand)
    if why_not is not None:
        print(f"mfuscope compare: nothing to compare: {why_not}", file=sys.stderr)
        return EXIT_BAD_INPUT
    comparison = compare(base, cand)
    gate = None if args.max_regression is None else args.max_regression / 100.0
    exceeded = bool(
        gate is not None and comparison.regression and comparison.regression.exceeds(gate)
    )
    for name, side in zip(("baseline", "candidate"), sides, strict=True):
        for line in side.warnings:
            print(f"mfuscope compare: warning: {name}: {line}", file=sys.stderr)
    for line in comparison.warnings:
        print(f"mfuscope compare: warning: {line}", file=sys.stderr)
    render = render_json if args.json else render_text
    sys.stdout.write(render(comparison, paths, gate, exceeded))
    if args.html is not None:
        from mfuscope.cli.compare._html import write_html

        try:
            page = write_html(comparison, paths, [s.content for s in sides], args.html)
        except OSError as exc:
            print(f"mfuscope compare: cannot write {args.html}: {exc}", file=sys.stderr)
            return EXIT_BAD_INPUT
        print(f"wrote {page.resolve()}", file=sys.stderr)
    return EXIT_REGRESSION if exceeded else 0
