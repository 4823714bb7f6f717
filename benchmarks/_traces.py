"""What the trace benchmarks share: the real traces, a generated one, and `analyze` run
in-process (read, gunzip, select, decode, analyse, render the JSON to a buffer)."""

from __future__ import annotations

import contextlib
import io
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TRACES = ROOT / ".." / "shared" / "traces"
REAL = [
    TRACES / "hta_resnet_ddp_2xA100" / "nccl_data.json.gz",
    TRACES / "tracelens_resnet_actckpt_8xMI300X" / "resnet_act_checkpoint.json.gz",
]


def write_generated(n_events: int, directory: Path) -> Path:
    """A realistic generated trace of at least `n_events` events (tests/support/trace_builder)."""
    if str(ROOT) not in sys.path:  # the benchmarks run as scripts; the builder lives in tests/
        sys.path.insert(0, str(ROOT))
    from tests.support.trace_builder import realistic_trace

    trace, count = realistic_trace(n_events)
    path = directory / f"generated_{count}_events.json"
    path.write_text(json.dumps(trace, separators=(",", ":")))
    return path


def analyze_in_process(path: Path) -> None:
    """`mfuscope analyze PATH --json`, its output discarded."""
    from mfuscope.cli import main

    with contextlib.redirect_stdout(io.StringIO()):
        code = main(["analyze", str(path), "--json"])
    assert code == 0, f"mfuscope analyze failed on {path}"


def warm_up() -> None:
    """Import what `analyze` imports (numpy, msgspec, the CLI) before anything is timed: a
    one-off cost of the process, not of any trace (with ``--repeat 1`` it landed on the first)."""
    analyze_in_process(REAL[0])
