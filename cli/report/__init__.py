"""`mfuscope report`: a self-contained HTML report from agent JSONL output or Kineto traces."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from mfuscope.cli.report.writer import TraceOptions

__all__ = [
    "DEFAULT_OUT_NAME",
    "add_arguments",
    "add_trace_arguments",
    "default_out_dir",
    "run",
    "trace_options",
]

DEFAULT_OUT_NAME = "mfuscope-report"


def _quantity(text: str) -> float:
    """FLOPs or FLOP/s with an optional suffix, as `calc` and `analyze` take them (310T)."""
    from mfuscope.cli._args import positive_quantity

    return positive_quantity(text)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "paths",
        nargs="+",
        type=Path,
        metavar="PATH",
        help="agent JSONL files (*.jsonl) or Kineto traces (*.json[.gz]), or directories of them",
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=None,
        help=f"output directory (default: ./{DEFAULT_OUT_NAME}/ in the current directory; the "
        "inputs are only read)",
    )
    parser.add_argument("--job", default=None, help="job to report when the input holds several")
    parser.add_argument("--no-png", action="store_true", help="write only the HTML file")
    add_trace_arguments(
        parser, "trace input (what a trace cannot say by itself)", "for the MFU plots"
    )


def add_trace_arguments(parser: argparse.ArgumentParser, title: str, flops_for: str) -> None:
    """The flags for what a trace cannot say by itself (those of `mfuscope analyze`), read back
    by `trace_options`; `flops_for` says what the model FLOPs are used for."""
    traces = parser.add_argument_group(title)
    traces.add_argument(
        "--model-flops-per-step",
        type=_quantity,
        default=None,
        metavar="F",
        help=f"model FLOPs per step per rank ({flops_for})",
    )
    traces.add_argument(
        "--recompute-flops-per-step",
        type=_quantity,
        default=None,
        metavar="F",
        help="activation-recomputation FLOPs per step per rank (for HFU)",
    )
    traces.add_argument(
        "--peak-flops",
        type=_quantity,
        default=None,
        metavar="P",
        help="dense peak FLOP/s per device (default: the trace's device in the datasheet "
        "table, for --dtype)",
    )
    traces.add_argument(
        "--dtype",
        default="bf16",
        help="training dtype for the datasheet peak (bf16, fp16, fp8, tf32, fp32; default bf16)",
    )
    traces.add_argument(
        "--gpus-per-node",
        type=int,
        default=None,
        metavar="N",
        help="ranks per host, for the intra/inter-node tiers (default: 8 on GPU traces)",
    )


def trace_options(args: argparse.Namespace) -> TraceOptions:
    """The `TraceOptions` of the flags `add_trace_arguments` added."""
    from mfuscope.cli.report.writer import TraceOptions

    return TraceOptions(
        model_flops_per_step=args.model_flops_per_step,
        recompute_flops_per_step=args.recompute_flops_per_step,
        peak_flops=args.peak_flops,
        gpus_per_node=args.gpus_per_node,
        dtype=args.dtype,
    )


def default_out_dir(cwd: Path | None = None) -> Path:
    """`mfuscope-report/` in the current directory (`cwd`): never inside the inputs, which may be
    read-only or shared."""
    return (cwd or Path.cwd()) / DEFAULT_OUT_NAME


def run(args: argparse.Namespace) -> int:
    from mfuscope.cli.report.summary import describe_run
    from mfuscope.cli.report.writer import load_run, write_report
    from mfuscope.core.errors import ReportInputError

    options = trace_options(args)
    try:
        loaded = load_run(args.paths, job=args.job, trace_options=options)
    except (ReportInputError, ValueError, OSError) as exc:
        print(f"mfuscope report: {exc}", file=sys.stderr)
        return 2
    for warning in loaded.warnings:
        print(f"mfuscope report: warning: {warning}", file=sys.stderr)
    out_dir = args.out or default_out_dir()
    generated = time.strftime("%Y-%m-%d %H:%M:%S %Z")
    try:
        files = write_report(loaded.run, out_dir, generated, png=not args.no_png)
    except OSError as exc:
        print(f"mfuscope report: cannot write the report in {out_dir}: {exc}", file=sys.stderr)
        return 2
    for line in describe_run(files.content):
        print(line)
    for plot, reason in files.missing:
        print(f"  {plot}: not drawn ({reason})")
    where = files.html.resolve()
    print(f"wrote {where}" + (f" and {len(files.pngs)} PNG files beside it" if files.pngs else ""))
    return 0
