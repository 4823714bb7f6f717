"""`mfuscope analyze PATH...`: decompose profiled steps of Kineto traces.

Each PATH is a trace file (``.json`` / ``.json.gz``, one rank each) or a directory searched
recursively for them (as `mfuscope report` does). MFU is against ``--peak-flops``, else the
device's dense peak for ``--dtype`` from the datasheet table; every `-` in the output comes with
its reason (in the JSON's ``warnings`` too).
Every file is read and analysed, and the whole output rendered, before anything is printed, so
bad input yields one line on stderr naming the file and the problem, exit code 2, and nothing on
stdout. That covers impossible timings (a negative or absurd ``ts``/``dur``), files that are not
regular files (a FIFO would block the read), and traces over ``--max-trace-bytes`` once
gzip-decoded (docs/analyze.md).
"""

from __future__ import annotations

import argparse
import importlib
import json
import math
import os
import sys
import threading
from collections import defaultdict
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

from mfuscope.cli._args import quantity
from mfuscope.core.bandwidth import aggregate_busbw_bytes_per_s, bus_factor
from mfuscope.core.errors import TraceError
from mfuscope.core.settings import env_name, parse_mapping
from mfuscope.core.trace.trace_io import (
    DEFAULT_MAX_TRACE_BYTES,
    ScannedTrace,
    decode_scanned,
    find_trace_files,
    gc_paused,
    scan_trace,
)
from mfuscope.core.vocabulary import SLICE_TITLES, TRACE_COMPONENTS

if TYPE_CHECKING:
    from mfuscope.core.hardware import PeakLookup
    from mfuscope.core.trace.result import RankAnalysis

__all__ = ["add_arguments", "run"]

# The engine: these import numpy (with the engine's own modules, about half of the start-up of
# `mfuscope analyze`: benchmarks/RESULTS.md#whole-process-and-start-up). The modules above do
# not, so the first trace is read, gunzipped and scanned (the last two without the GIL) while a
# thread imports these; the functions below import from them only after that thread is joined.
_ENGINE_MODULES = (
    "mfuscope.core.trace.decompose",
    "mfuscope.core.trace.inputs",
    "mfuscope.core.trace.options",
    "mfuscope.core.trace.to_json",
)

EXIT_BAD_INPUT = 2
_PROGRESS_MIN_BYTES = 8 << 20  # show progress for files that take more than a moment
# FLOPs per step per rank beyond any machine (an exaFLOP/s device running a day is ~1e23): larger
# inputs are typos, and would overflow the ratios built on them.
_MAX_FLOPS_PER_STEP = 1e30


def _flops(text: str) -> float:
    value = quantity(text)
    if not (math.isfinite(value) and 0 <= value <= _MAX_FLOPS_PER_STEP):
        raise argparse.ArgumentTypeError(
            f"expected FLOPs in [0, {_MAX_FLOPS_PER_STEP:g}], got {text}"
        )
    return value


def _peak(text: str) -> float:
    value = quantity(text)
    if not (math.isfinite(value) and (value == 0 or 1 <= value <= 1e21)):
        raise argparse.ArgumentTypeError(f"expected a FLOP/s in [1, 1e21] (0: unset), got {text}")
    return value


def _byte_count(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of bytes, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a number of bytes >= 1, got {text}")
    return value


def _axis_override(text: str) -> dict[str, str]:
    try:
        mapping = parse_mapping(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"expected GROUP=AXIS[,GROUP=AXIS...]: {exc}") from None
    if not mapping:
        raise argparse.ArgumentTypeError(f"expected GROUP=AXIS, got {text!r}")
    return mapping


def _axis_overrides(given: Sequence[Mapping[str, str]]) -> dict[str, str]:
    """`--axis` entries, else ``MFUSCOPE_AXIS_OVERRIDES`` (the agent's setting, same syntax)."""
    if given:
        return {group: axis for mapping in given for group, axis in mapping.items()}
    text = os.environ.get(env_name("axis_overrides"), "")
    try:
        return parse_mapping(text)
    except ValueError as exc:
        raise ValueError(f"{env_name('axis_overrides')}: {exc}") from None


def _window_range(text: str) -> tuple[float, float]:
    start, sep, end = text.partition(":")
    try:
        bounds = (float(start), float(end))
    except ValueError:
        bounds = (math.nan, math.nan)
    if not sep or not all(math.isfinite(b) for b in bounds) or not bounds[1] > bounds[0]:
        raise argparse.ArgumentTypeError(f"expected START_US:END_US with END > START, got {text!r}")
    return bounds


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("paths", nargs="+", metavar="PATH", help="trace file or directory")
    parser.add_argument(
        "--gpus-per-node",
        type=int,
        default=None,
        help="ranks per host for intra/inter-node tiers (default: 8 on GPU traces; "
        "CPU traces: all ranks on one host)",
    )
    parser.add_argument(
        "--model-flops-per-step",
        type=_flops,
        help="model FLOPs per step per rank, e.g. 3.1e14 or 310T (`mfuscope calc` gives them)",
    )
    parser.add_argument(
        "--recompute-flops-per-step",
        type=_flops,
        help="activation-recomputation FLOPs per step per rank (for HFU)",
    )
    parser.add_argument(
        "--peak-flops",
        type=_peak,
        help="dense peak FLOP/s of one device (for MFU), e.g. 989T; default: the trace's "
        "device in the datasheet table, for --dtype",
    )
    parser.add_argument(
        "--dtype",
        default="bf16",
        help="training dtype for the datasheet peak when --peak-flops is not given "
        "(bf16, fp16, fp8, tf32, fp32; default bf16)",
    )
    parser.add_argument(
        "--max-trace-bytes",
        type=_byte_count,
        default=DEFAULT_MAX_TRACE_BYTES,
        metavar="BYTES",
        help="refuse a trace larger than this once gzip-decoded "
        f"(default {DEFAULT_MAX_TRACE_BYTES >> 30} GiB; decoding needs several times it in memory)",
    )
    parser.add_argument(
        "--axis",
        type=_axis_override,
        action="append",
        default=[],
        metavar="GROUP=AXIS",
        help="name the axis of a process group (by pg name or description, e.g. "
        "TENSOR_MODEL_PARALLEL_GROUP=tp); comma-separated or repeated; "
        "default: $MFUSCOPE_AXIS_OVERRIDES",
    )
    windows = parser.add_mutually_exclusive_group()
    windows.add_argument(
        "--window-annotation",
        metavar="NAME",
        help="analyse each range of this record_function / user annotation instead of the "
        "profiler steps",
    )
    windows.add_argument(
        "--window-range",
        type=_window_range,
        metavar="START_US:END_US",
        help="analyse one window, in the trace's own ts clock (microseconds)",
    )
    parser.add_argument("--json", action="store_true", help="print mfuscope.analysis/1 JSON")


def _announce(progress: TextIO | None, index: int, files: Sequence[Path]) -> None:
    """Say which file is being read, on a terminal, when it takes more than a moment."""
    file = files[index - 1]
    if progress is not None and file.is_file() and file.stat().st_size >= _PROGRESS_MIN_BYTES:
        print(f"\r[{index}/{len(files)}] reading {file.name} ...", end="", file=progress)
        progress.flush()


def _import_engine() -> None:
    """Import the engine's modules (on the loader thread). A failure is left to the main
    thread, whose own import of the module then raises it where it can be reported."""
    for name in _ENGINE_MODULES:
        try:
            importlib.import_module(name)
        except Exception:
            return


def _scan_first(path: os.PathLike[str], max_bytes: int) -> ScannedTrace:
    """Read, gunzip and scan the first trace while the engine imports on a thread. The two
    never wait on each other's module locks: everything this thread runs before the join is
    already imported (no numpy, no engine module: tests/unit/cli/test_cli_dispatch.py)."""
    loader = threading.Thread(target=_import_engine, name="mfuscope-import-engine", daemon=True)
    loader.start()
    try:
        return scan_trace(path, max_bytes=max_bytes)
    finally:
        loader.join()


def _analyse_all(
    args: argparse.Namespace, progress: TextIO | None
) -> tuple[list[tuple[RankAnalysis, PeakLookup]], list[str]]:
    """The analyses sorted by rank with the peak each was measured against, and the warnings
    (per file, then across files, then why a value is unknown)."""
    files = [file for path in args.paths for file in find_trace_files(path)]
    axis_overrides = _axis_overrides(args.axis)
    _announce(progress, 1, files)
    pending: ScannedTrace | None = _scan_first(files[0], args.max_trace_bytes)
    from mfuscope.core.trace.decompose import analyze_trace  # loaded: _ENGINE_MODULES
    from mfuscope.core.trace.inputs import input_warnings
    from mfuscope.core.trace.options import analysis_options, options_for_trace

    base = analysis_options(
        device=None,  # per trace, below
        gpus_per_node=args.gpus_per_node,
        axis_overrides=axis_overrides,
        model_flops_per_step=args.model_flops_per_step,
        recompute_flops_per_step=args.recompute_flops_per_step,
        peak_flops=args.peak_flops or None,
        window_annotation=args.window_annotation,
        window_range_us=args.window_range,
    )
    results: list[tuple[str, RankAnalysis]] = []
    peaks: list[PeakLookup] = []
    for index, file in enumerate(files, 1):
        if pending is None:
            _announce(progress, index, files)
            pending = scan_trace(file, max_bytes=args.max_trace_bytes)
        trace = decode_scanned(pending)
        pending = None  # its bytes are freed now
        try:
            options, peak = options_for_trace(trace, base, args.dtype)
            results.append((str(file), analyze_trace(trace, options)))
        except TraceError as exc:
            raise TraceError(file, exc.message) from None
        peaks.append(peak)
    if progress is not None:
        print("\r\033[K", end="", file=progress)
    warnings = [f"{name}: {line}" for name, r in results for line in r.warnings]
    warnings += input_warnings(results)
    ranked = sorted(
        ((r, peak) for (_, r), peak in zip(results, peaks, strict=True)), key=lambda x: x[0].rank
    )
    return ranked, warnings


def _pct(part: float, whole: float) -> str:
    return f"{100.0 * part / whole:5.1f}%" if whole > 0 else "    -"


def _ratio(value: float | None) -> str:
    return "    -" if value is None else f"{100.0 * value:5.1f}%"


def _size(n: int | None) -> str:
    if n is None:
        return "?"
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{n} B"


def _format_rank(
    rank: RankAnalysis, peak: PeakLookup, notes: Sequence[str], out: list[str]
) -> None:
    from mfuscope.cli._analyze_text import of_spec, peak_words, waterfall_line
    from mfuscope.core.trace.result import (  # loaded: _ENGINE_MODULES
        WINDOW_PROFILER_STEP,
        WINDOW_RANGE,
        WINDOW_WHOLE_TRACE,
    )

    window_words = {
        WINDOW_WHOLE_TRACE: "the whole trace as one window (no ProfilerStep#N in the trace)",
        WINDOW_RANGE: "the chosen time range",
    }
    out.append(f"rank {rank.rank}/{rank.world_size}  device: {rank.device}  {peak_words(peak)}")
    sources = sorted({s.window_source for s in rank.steps})
    if sources != [WINDOW_PROFILER_STEP]:
        out.append(f"  windows: {', '.join(window_words.get(s, s) for s in sources)}")
    # One column per bucket, in the vocabulary's order, each as wide as its title.
    widths = {c: max(len(SLICE_TITLES[c]), 7) for c in TRACE_COMPONENTS}
    out.append(
        "  step    wall ms  "
        + "  ".join(f"{SLICE_TITLES[c]:>{widths[c]}}" for c in TRACE_COMPONENTS)
        + "  overlap ms     MFU     HFU"
    )
    for s in rank.steps:
        w = s.wall_s
        buckets = "  ".join(
            f"{_pct(getattr(s, f'{c}_s'), w):>{widths[c]}}" for c in TRACE_COMPONENTS
        )
        out.append(
            f"  {s.step:>4} {w * 1e3:10.3f}  {buckets}"
            f"  {s.overlapped_comm_s * 1e3:10.3f}  {_ratio(s.mfu)}  {_ratio(s.hfu)}"
        )
    by_class: dict[str, float] = defaultdict(float)
    for s in rank.steps:
        for name, seconds in (s.compute_classes.as_dict() if s.compute_classes else {}).items():
            by_class[name] += seconds
    compute_total = math.fsum(by_class.values())
    if compute_total > 0:
        parts = [f"{name} {_pct(sec, compute_total).strip()}" for name, sec in by_class.items()]
        out.append("  compute by kernel class: " + ", ".join(parts))
    exposed: dict[tuple[str, str], float] = defaultdict(float)
    for s in rank.steps:
        for e in s.exposed_comm:
            exposed[(e.axis, e.tier)] += e.seconds
    if exposed:
        parts = [f"{a}/{t} {sec * 1e3:.3f} ms" for (a, t), sec in sorted(exposed.items())]
        out.append("  exposed comm over all steps: " + ", ".join(parts))
    waterfall = waterfall_line(rank)
    if waterfall is not None:
        out.append(waterfall)
    groups: dict[tuple[str, str, str, int | None, int | None], list[float]] = defaultdict(list)
    for s in rank.steps:
        for c in s.collectives:
            groups[(c.op, c.axis, c.tier, c.group_size, c.bytes)].append(c.seconds)
    out.extend(f"  note: {note}" for note in notes)
    if not groups:
        return
    out.append(
        "  collectives:  op              axis        tier              n        size  count"
        "    mean ms  busbw GB/s  of spec"
    )
    for (op, axis, tier, n, size), times in sorted(
        groups.items(), key=lambda kv: (kv[0][0], kv[0][1], kv[0][2], kv[0][4] or -1)
    ):
        total = math.fsum(times)
        # The calls of one size, summed: Σ bus bytes / Σ t (docs/definitions.md#aggregating-busbw).
        rate = (
            None
            if size is None or n is None
            else aggregate_busbw_bytes_per_s(len(times) * size * bus_factor(op, n), total)
        )
        busbw = "         -" if rate is None else f"{rate / 1e9:10.3f}"
        spec = of_spec(rank, tier, rate)
        out.append(
            f"                {op:<15} {axis:<11} {tier:<11} {_group_size(n):>7} {_size(size):>11}"
            f"  {len(times):>5} {total / len(times) * 1e3:10.3f}  {busbw}  {spec}"
        )


def _group_size(n: int | None) -> str:
    """The group size column: ``unknown`` when the trace does not say (never the world size)."""
    return "unknown" if n is None else str(n)


def format_table(
    ranked: Sequence[tuple[RankAnalysis, PeakLookup]], notes: Mapping[int, Sequence[str]]
) -> str:
    """The human-readable report: percentages of each step per bucket, the waterfall, why any
    value is `-`, then collectives with busbw against the tier's spec."""
    out: list[str] = []
    for rank, peak in ranked:
        if out:
            out.append("")
        _format_rank(rank, peak, notes.get(rank.rank, ()), out)
    return "\n".join(out) + "\n"


def run(args: argparse.Namespace) -> int:
    progress = sys.stderr if sys.stderr.isatty() else None
    try:
        if args.gpus_per_node is not None and args.gpus_per_node < 1:
            raise ValueError("--gpus-per-node must be >= 1")
        with gc_paused():  # a trace is millions of fresh objects, none garbage
            ranked, warnings = _analyse_all(args, progress)
        output = _render(ranked, warnings, _notes(args, ranked), as_json=args.json)
    except TraceError as exc:
        name = exc.path if exc.path is not None else "trace"
        print(f"mfuscope analyze: {name}: {exc.message}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except ValueError as exc:
        print(f"mfuscope analyze: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except MemoryError:
        print(
            "mfuscope analyze: out of memory reading the traces "
            "(lower --max-trace-bytes, or analyse fewer files at once)",
            file=sys.stderr,
        )
        return EXIT_BAD_INPUT
    for line in warnings:
        print(f"mfuscope analyze: warning: {line}", file=sys.stderr)
    sys.stdout.write(output)
    return 0


def _notes(
    args: argparse.Namespace, ranked: Sequence[tuple[RankAnalysis, PeakLookup]]
) -> dict[int, list[str]]:
    """Rank -> why each kind of `-` in its output is there."""
    from mfuscope.cli._analyze_text import missing_value_reasons

    return {
        rank.rank: missing_value_reasons(
            rank,
            peak,
            model_flops_given=args.model_flops_per_step is not None,
            recompute_flops_given=args.recompute_flops_per_step is not None,
        )
        for rank, peak in ranked
    }


def _render(
    ranked: Sequence[tuple[RankAnalysis, PeakLookup]],
    warnings: Sequence[str],
    notes: Mapping[int, Sequence[str]],
    *,
    as_json: bool,
) -> str:
    """The whole output, built before anything is written; the JSON carries each rank's notes
    in its ``warnings``. Raises ValueError for a result that is not a finite number (only absurd
    FLOP inputs get there)."""
    from mfuscope.core.trace.to_json import analysis_to_json  # loaded: _ENGINE_MODULES
    from msgspec.structs import replace

    if not as_json:
        return format_table(ranked, notes)
    ranks = [replace(r, warnings=(*r.warnings, *notes.get(r.rank, ()))) for r, _ in ranked]
    every = [*warnings, *(f"rank {r.rank}: {n}" for r, _ in ranked for n in notes.get(r.rank, ()))]
    try:
        return json.dumps(analysis_to_json(ranks, every), allow_nan=False) + "\n"
    except ValueError:
        raise ValueError(
            "a result is not a finite number: check --model-flops-per-step and --peak-flops"
        ) from None
