"""`mfuscope validate-gpu`: prove the measurements on real hardware, in one command.

On a machine with a CUDA GPU (one is enough) it runs the probes (`_probes`: detection, a bf16
matmul, a small GPT training loop under the agent, a profiled window, an NCCL group, the hardware
counters under load; `_agent_probes`: the agent's step MFU, its window's and its carried steps'
buckets against the job's own CUDA-event timing, and its per-step cost on the training thread
against the floor; `_flight`: the agent's flight-recorder reading on NCCL, its durations against
CUDA events, with a deliberate stall) in at most 5 minutes (`--quick`: 2), prints each check
with its figures and verdict, and writes ``DIR/validate.json`` and ``DIR/validate.md``
(`_report`). Without one
it prints ``no CUDA device: validate-gpu skipped`` and exits 0. The exit code is 0 when every check
passed and 1 otherwise.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

__all__ = ["SKIPPED_MESSAGE", "add_arguments", "cuda_available", "run"]

SKIPPED_MESSAGE = "no CUDA device: validate-gpu skipped"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--out",
        type=Path,
        default=Path("mfuscope-validate"),
        metavar="DIR",
        help="folder for validate.json and validate.md (default: ./mfuscope-validate)",
    )
    parser.add_argument(
        "--quick", action="store_true", help="fewer steps and smaller sizes (at most 2 minutes)"
    )


def cuda_available() -> bool:
    """True when torch is installed and sees a CUDA device (torch is imported only here)."""
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available() and torch.cuda.device_count() > 0)


def run(args: argparse.Namespace) -> int:
    if not cuda_available():
        print(SKIPPED_MESSAGE)
        return 0
    from mfuscope.cli.validate_gpu._report import build_report, write_report
    from mfuscope.cli.validate_gpu._run import measure_all

    measurements = measure_all(out_dir=args.out, quick=args.quick, log=sys.stderr)
    report = build_report(measurements)
    json_path, md_path = write_report(report, args.out)
    for check in report["checks"]:  # the figures, before the verdict
        print(f"{'ok  ' if check['ok'] else 'FAIL'} {check['name']}: {check['measured']}")
    print(f"{'PASS' if report['ok'] else 'FAIL'}: wrote {json_path} and {md_path}")
    return 0 if report["ok"] else 1
