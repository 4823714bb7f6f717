"""Read the report's input from disk: agent JSONL output, or Kineto traces through the engine.

Agent JSONL: one batch per line in the collector wire format (`*.jsonl`, or `*.jsonl.gz`). A line
that does not parse (typically the last line of a killed job) is skipped with a warning rather
than losing the whole run. Traces: `*.json` / `*.json.gz` Kineto files, one per rank, decomposed
by the analysis engine; model FLOPs come from the options and the peak from them or the datasheet
table, as for `mfuscope analyze`.
"""

from __future__ import annotations

import gzip
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from mfuscope.core.errors import ReportInputError, SchemaError
from mfuscope.core.run_summary.run_data import RunData, merge_batches
from mfuscope.core.schema import ReportBatch, decode_batch

__all__ = ["Loaded", "TraceOptions", "find_inputs", "load_run", "read_batches"]

JSONL_SUFFIXES = (".jsonl", ".jsonl.gz")
TRACE_SUFFIXES = (".json", ".json.gz")
MAX_WARNINGS = 20


@dataclass(frozen=True)
class TraceOptions:
    """What a trace cannot say by itself (the `mfuscope analyze` flags)."""

    model_flops_per_step: float | None = None
    recompute_flops_per_step: float | None = None
    peak_flops: float | None = None
    dtype: str = "bf16"  # for the datasheet peak when `peak_flops` is not given
    gpus_per_node: int | None = None


@dataclass(frozen=True)
class Loaded:
    run: RunData
    files: tuple[Path, ...]
    warnings: tuple[str, ...]


def _has_suffix(path: Path, suffixes: Sequence[str]) -> bool:
    return any(path.name.endswith(s) for s in suffixes)


def find_inputs(paths: Sequence[Path]) -> tuple[list[Path], list[Path]]:
    """(JSONL files, trace files) named by `paths`; directories are searched recursively."""
    jsonl: list[Path] = []
    traces: list[Path] = []
    for path in paths:
        if not path.exists():
            raise ReportInputError(f"{path}: no such file or directory")
        candidates = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
        for candidate in candidates:
            if _has_suffix(candidate, JSONL_SUFFIXES):
                jsonl.append(candidate)
            elif _has_suffix(candidate, TRACE_SUFFIXES):
                traces.append(candidate)
            elif not path.is_dir():
                raise ReportInputError(
                    f"{candidate}: expected agent output (*.jsonl) or a Kineto trace (*.json[.gz])"
                )
    return jsonl, traces


def read_batches(files: Sequence[Path]) -> tuple[list[ReportBatch], list[str]]:
    """Every valid batch in `files`, and one warning per line that is not a valid batch."""
    batches: list[ReportBatch] = []
    warnings: list[str] = []
    for path in files:
        opener = gzip.open if path.name.endswith(".gz") else open
        try:
            with opener(path, "rt", encoding="utf-8") as stream:
                for number, line in enumerate(stream, start=1):
                    if not line.strip():
                        continue
                    try:
                        batches.append(decode_batch(line))
                    except SchemaError as exc:
                        warnings.append(f"{path}:{number}: skipped: {exc}")
        except (OSError, EOFError, UnicodeDecodeError) as exc:
            warnings.append(f"{path}: unreadable after {len(batches)} batches: {exc}")
    return batches, warnings


def load_run(
    paths: Sequence[Path], job: str | None = None, trace_options: TraceOptions | None = None
) -> Loaded:
    """Load one job from `paths`; agent JSONL wins when a directory holds both kinds of input.

    Raises `ReportInputError` when nothing usable is found.
    """
    jsonl, traces = find_inputs(paths)
    if jsonl:
        batches, warnings = read_batches(jsonl)
        if not batches:
            detail = f" ({warnings[0]})" if warnings else ""
            names = ", ".join(str(f) for f in jsonl[:3]) + (", ..." if len(jsonl) > 3 else "")
            raise ReportInputError(f"no valid agent batch in {names}{detail}")
        run = merge_batches(batches, job, source=f"agent output ({len(jsonl)} JSONL files)")
        return Loaded(run, tuple(jsonl), _capped(warnings))
    if traces:
        from mfuscope.cli.report._traces import run_from_traces

        run = run_from_traces(traces, trace_options or TraceOptions())
        return Loaded(run, tuple(traces), ())
    where = ", ".join(str(p) for p in paths)
    raise ReportInputError(f"no agent output (*.jsonl) or traces (*.json[.gz]) in {where}")


def _capped(warnings: list[str]) -> tuple[str, ...]:
    if len(warnings) <= MAX_WARNINGS:
        return tuple(warnings)
    return (*warnings[:MAX_WARNINGS], f"... and {len(warnings) - MAX_WARNINGS} more")
