"""The demo training job: run it under torchrun (`mfuscope demo` does).

    torchrun --standalone --nproc_per_node=2 -m mfuscope.cli.demo.job.train_demo --steps 50

Without `--steps` or `--max-seconds` it trains 100 steps; with `--max-seconds S` it stops after
about S seconds (all ranks at the same step).

Data parallel (default): every rank holds the whole model (`GPTStage` over all layers) wrapped in
DDP over the `dp` axis of a DeviceMesh, with small gradient buckets so the all-reduces overlap the
backward pass. `--pipeline`: the layers are cut into 2 stages on a `pp` mesh axis (times `dp` for
the remaining ranks); each step runs `--microbatches` microbatches GPipe-style (all forwards, then
all backwards on the first stage; forward+backward per microbatch on the last), handing activations
and gradients over with send/recv, so the pipeline bubble of (p-1)/(m+p-1) shows.

Progress for the launcher goes to stdout as lines `mfuscope-demo {json}` (an `event` key plus
fields), printed by rank 0 (lifecycle) and by the rank that computes the loss (steps), so a
launcher can show what happens while torch starts. Nothing else is printed on success.
"""

from __future__ import annotations

import argparse
import atexit
import gc
import json
import os
import sys
import time
from collections.abc import Sequence
from typing import Any

__all__ = ["PROGRESS_PREFIX", "main", "parse_args"]

PROGRESS_PREFIX = "mfuscope-demo "


def _emit(event: str, **fields: Any) -> None:
    print(PROGRESS_PREFIX + json.dumps({"event": event, **fields}), flush=True)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=None, help="stop after this many steps")
    parser.add_argument(
        "--max-seconds", type=float, default=None, help="stop after about this many seconds"
    )
    parser.add_argument("--job", default="demo", help="job name reported to mfuscope")
    parser.add_argument("--collector-url", default=None, help="collector base URL")
    parser.add_argument("--jsonl-dir", default=None, help="also write agent batches here")
    parser.add_argument("--no-agent", action="store_true", help="train without mfuscope")
    parser.add_argument("--pipeline", action="store_true", help="2-stage pipeline over `pp`")
    parser.add_argument("--microbatches", type=int, default=4, help="pipeline microbatches")
    parser.add_argument("--batch-size", type=int, default=8, help="sequences per rank per step")
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--d-model", type=int, default=128)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--seq-len", type=int, default=64)
    parser.add_argument("--checkpoint-every", type=int, default=2, help="0 disables")
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--log-every", type=int, default=5, help="steps between progress lines")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--profile-first-step", type=int, default=3, help="first profiled step")
    parser.add_argument("--profile-every-s", type=float, default=10.0, help="profiling period")
    parser.add_argument(
        "--profile-max-overhead", type=float, default=0.2, help="cap on profiling time / run time"
    )
    args = parser.parse_args(argv)
    if args.steps is None and args.max_seconds is None:
        args.steps = 100
    if args.steps is not None and args.steps < 1:
        parser.error("--steps must be >= 1")
    if args.max_seconds is not None and not args.max_seconds > 0:
        parser.error("--max-seconds must be > 0")
    if args.pipeline and args.batch_size % args.microbatches:
        parser.error("--batch-size must be a multiple of --microbatches")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    rank = int(os.environ.get("RANK", "0"))
    lifecycle = rank == 0
    if lifecycle:
        _emit("importing_torch")
    started = time.monotonic()
    # Imported here, after the first progress line: importing torch takes seconds.
    from mfuscope.cli.demo.job import _job

    if lifecycle:
        _emit("torch_ready", seconds=round(time.monotonic() - started, 2))
    return _job.run(args, _emit)


if __name__ == "__main__":
    # The demo's ranks end sooner: frozen at exit, torch's objects are skipped by the
    # interpreter's last garbage collections (about 1 s of CPU per rank otherwise, after the
    # agent's close and every report sent).
    atexit.register(gc.freeze)
    sys.exit(main())
