"""`mfuscope calc`: back-of-envelope FLOPs, MFU/HFU and communication what-if, with `--json`.

Pure arithmetic over `mfuscope.core` (no torch, no I/O beyond printing): the options are in
`_options`, the figures in `_figures`, the communication what-if in `_comm`, the text in
`_render`. See docs/calc.md for the formulas and worked examples.
"""

from __future__ import annotations

import argparse
import json
import sys

from mfuscope.cli.calc._figures import compute
from mfuscope.cli.calc._options import add_arguments
from mfuscope.cli.calc._render import render_text
from mfuscope.core.errors import CalcError

__all__ = ["CalcError", "add_arguments", "compute", "run"]


def run(args: argparse.Namespace) -> int:
    try:
        result = compute(args)
    except CalcError as exc:
        print(f"mfuscope calc: error: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(result, indent=2, allow_nan=False))
    else:
        print(render_text(result))
    if result["peak_source"] == "unknown" and (args.step_time or args.tokens_per_s):
        print(f"mfuscope calc: note: {result['peak_message']}", file=sys.stderr)
    return 0
