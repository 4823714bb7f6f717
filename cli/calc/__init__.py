"""`mfuscope calc`: back-of-envelope FLOPs, MFU/HFU and communication what-if, with `--json`.

Pure arithmetic over `mfuscope.core` (no torch, no I/O beyond printing): the options are in
`_options`, the figures in `_figures`, the communication what-if in `_comm`, the text in
`_render`. The one exception is the CPU peak (`--device cpu`, `--calibrate`, in `_cpu_peak`):
measured on this machine through the agent's calibration, only when asked. See docs/calc.md for
the formulas and worked examples.
"""

from __future__ import annotations

import argparse
import json
import sys

from mfuscope.cli.calc._cpu_peak import cpu_peaks
from mfuscope.cli.calc._figures import compute
from mfuscope.cli.calc._options import add_arguments, is_cpu, with_dtype
from mfuscope.cli.calc._render import render_text
from mfuscope.core.errors import CalcError

__all__ = ["CalcError", "add_arguments", "compute", "run"]


def _has_model(args: argparse.Namespace) -> bool:
    return any(
        getattr(args, k) is not None for k in ("params", "active_params", "layers", "hidden")
    )


def run(args: argparse.Namespace) -> int:
    args = with_dtype(args)
    peaks = None
    if args.calibrate or (is_cpu(args.device) and args.peak_flops is None):
        try:
            peaks = cpu_peaks(args.dtype, calibrate=args.calibrate)
        except ImportError:
            print(
                "mfuscope calc: error: the CPU peak is measured with torch: install "
                "mfuscope[agent] (or pass --peak-flops)",
                file=sys.stderr,
            )
            return 2
        except ValueError as exc:
            print(f"mfuscope calc: error: {exc}", file=sys.stderr)
            return 2
        if not args.json:
            print("\n".join(peaks.lines()))
        if args.calibrate and not _has_model(args):
            if args.json:
                print(json.dumps({"cpu_peaks": peaks.as_json()}, indent=2, allow_nan=False))
            return 0
    try:
        result = compute(args, cpu_peak=None if peaks is None else peaks.lookup)
    except CalcError as exc:
        print(f"mfuscope calc: error: {exc}", file=sys.stderr)
        return 2
    if args.json:
        if peaks is not None:
            result["cpu_peaks"] = peaks.as_json()
        print(json.dumps(result, indent=2, allow_nan=False))
    else:
        print(render_text(result))
    if result["peak_source"] == "unknown" and (args.step_time or args.tokens_per_s):
        print(f"mfuscope calc: note: {result['peak_message']}", file=sys.stderr)
    return 0
