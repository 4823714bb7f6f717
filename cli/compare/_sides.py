"""Read one side of `mfuscope compare`: traces, agent output, or a collector summary.

A path is a collector summary when it is one JSON file holding the ``/v1/summary`` document (an
object with ``version`` and ``jobs``); anything else goes to the report's loader
(`cli.report.writer.load_run`), which takes agent JSONL (it wins when a directory holds both) or
Kineto traces, a file or a directory of ranks, decomposed as `mfuscope analyze` does.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from mfuscope.cli.compare._profile import profile_of_content, profile_of_summary
from mfuscope.cli.report.writer import ReportContent, TraceOptions, build_content, load_run
from mfuscope.core.errors import ReportInputError
from mfuscope.core.run_summary.comparison import RunProfile

__all__ = ["Side", "load_side"]

# A summary is a few kB per job; a larger plain .json file is a trace and is not parsed twice.
_MAX_SUMMARY_BYTES = 8 << 20


@dataclass(frozen=True)
class Side:
    profile: RunProfile
    content: ReportContent | None  # None for a collector summary (no steps to plot)
    warnings: tuple[str, ...]


def _summary_document(path: Path) -> dict[str, object] | None:
    """The summary in `path`, or None when it is not one."""
    if not path.is_file() or path.suffix != ".json" or path.stat().st_size > _MAX_SUMMARY_BYTES:
        return None
    try:
        document = json.loads(path.read_bytes())
    except (ValueError, OSError):
        return None
    if isinstance(document, dict) and "jobs" in document and "version" in document:
        return document
    return None


def load_side(path: Path, job: str | None, options: TraceOptions) -> Side:
    """Load and profile one side. Raises `ReportInputError`, `TraceError` or `OSError` with
    what is wrong."""
    document = _summary_document(path)
    if document is not None:
        version = document.get("version")
        if version != 1:
            raise ReportInputError(f"{path}: collector summary version {version!r} (expected 1)")
        return Side(profile_of_summary(document, job, str(path)), None, ())
    loaded = load_run([path], job=job, trace_options=options)
    kind = "agent output" if loaded.files[0].name.endswith((".jsonl", ".jsonl.gz")) else "traces"
    content = build_content(loaded.run)
    return Side(profile_of_content(content, kind), content, loaded.warnings)
