"""Keep the traces of the last profiled windows, so a person can open the window behind a number.

With ``keep_traces=N`` (docs/agent.md) the analyser thread gzips each window's exported Kineto
trace into ``keep_traces_dir`` before deleting the temporary file, as
``mfuscope-rank{R}-step{FIRST}-{LAST}-{SEQ}.json.gz`` (open it in Perfetto or TensorBoard, or
``mfuscope analyze`` it). Then it rotates: only this rank's newest N files are kept, and the
oldest go while they hold more than ``keep_traces_max_bytes`` together (the newest is always
kept, so one window bigger than the cap is still there to look at). Top-level fields the agent
adds (the gloo worker-thread map, `core.trace.worker_groups`) are written in front of the trace's
own keys on the way, so ``mfuscope analyze`` of a kept trace reads them too.

Runs on the analyser thread, never on the training thread; a failure to keep a trace (disk
full, no permission) is counted by the caller and never stops the analysis.
"""

from __future__ import annotations

import gzip
import json
import os
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import IO, Any

__all__ = ["TraceKeeper"]

_COMPRESS_LEVEL = 1  # traces are JSON: level 1 already shrinks them ~8x, at a fraction of the CPU


class TraceKeeper:
    """Copies window traces into `directory` (gzipped) and keeps this rank's newest `keep`."""

    def __init__(
        self, directory: str | os.PathLike[str], keep: int, max_bytes: int, rank: int
    ) -> None:
        if keep < 1:
            raise ValueError(f"keep must be >= 1, got {keep}")
        if max_bytes < 1:
            raise ValueError(f"max_bytes must be >= 1, got {max_bytes}")
        self.directory = Path(directory)
        self.keep = keep
        self.max_bytes = max_bytes
        self._prefix = f"mfuscope-rank{rank}-"
        self._sequence = 0

    def _mine(self) -> list[Path]:
        """This rank's kept traces, oldest first (by the sequence number in the name, then
        modification time: files from an earlier run of the job sort before this run's)."""
        found = []
        for path in self.directory.glob(f"{self._prefix}*.json.gz"):
            try:
                found.append((path.stat().st_mtime_ns, path.name, path))
            except OSError:
                continue  # removed meanwhile
        return [path for _, _, path in sorted(found)]

    def keep_trace(
        self, trace_path: str, steps: tuple[int, ...], fields: Mapping[str, Any] | None = None
    ) -> Path:
        """Gzip `trace_path` into the directory, rotate, and return the kept file's path.
        `fields`: top-level keys (JSON values) to add to the trace.

        Raises OSError when the file cannot be written (the caller counts it and goes on).
        """
        self.directory.mkdir(parents=True, exist_ok=True)
        first, last = (min(steps), max(steps)) if steps else (0, 0)
        self._sequence += 1
        name = f"{self._prefix}step{first}-{last}-{os.getpid()}-{self._sequence:06d}.json.gz"
        target = self.directory / name
        partial = target.with_name(target.name + ".partial")  # never a half-written .json.gz
        try:
            with (
                open(trace_path, "rb") as source,
                gzip.open(partial, "wb", compresslevel=_COMPRESS_LEVEL) as sink,
            ):
                if fields:
                    _copy_with_fields(source, sink, fields)
                else:
                    shutil.copyfileobj(source, sink, 1 << 20)
            os.replace(partial, target)
        finally:
            if partial.exists():
                partial.unlink()
        self._rotate(target)
        return target

    def _rotate(self, newest: Path) -> None:
        kept = self._mine()
        excess = kept[: max(len(kept) - self.keep, 0)]
        rest = kept[len(excess) :]
        sizes = {}
        for path in rest:
            try:
                sizes[path] = path.stat().st_size
            except OSError:
                sizes[path] = 0
        total = sum(sizes.values())
        for path in rest:
            if total <= self.max_bytes or path == newest:
                break
            excess.append(path)
            total -= sizes[path]
        for path in excess:
            path.unlink(missing_ok=True)


def _copy_with_fields(source: IO[bytes], sink: gzip.GzipFile, fields: Mapping[str, Any]) -> None:
    """Copy the JSON object in `source` to `sink` with `fields` written as its first keys,
    streaming (a trace is tens of MB); a document that is not an object is copied unchanged."""
    head = source.read(1 << 16)
    while head.strip() == b"" and (more := source.read(1 << 16)):
        head += more
    body = head.lstrip()
    if not body.startswith(b"{"):
        sink.write(head)
        shutil.copyfileobj(source, sink, 1 << 20)
        return
    body = body[1:]
    while body.strip() == b"" and (more := source.read(1 << 16)):
        body += more
    added = json.dumps(dict(fields), separators=(",", ":"))[1:-1].encode()
    separator = b"" if body.lstrip().startswith(b"}") else b","
    sink.write(b"{" + added + separator + body)
    shutil.copyfileobj(source, sink, 1 << 20)
