"""Follow the agents' JSONL output while the demo's job runs: what the step breakdowns are of.

The collector's summary gives the latest breakdown but not which steps were measured; the agents'
own output (one batch per line, the wire format) does. Each poll reads only the lines appended
since the last one (a line still being written is kept for the next poll) and tells measured from
carried steps with `core.run_summary.coverage`, plus how old the newest window is.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from mfuscope.core.errors import SchemaError
from mfuscope.core.run_summary.coverage import Coverage, rank_coverage
from mfuscope.core.schema import StepReport, decode_batch

__all__ = ["AgentTail", "BreakdownStatus"]


@dataclass(frozen=True)
class BreakdownStatus:
    """What the breakdowns seen so far cover, and the age of the newest window: the steps and
    seconds from its last measured step to the newest step reported (rank 0's, else the lowest
    rank's)."""

    coverage: Coverage
    latest_window_step: int | None
    window_age_steps: int | None
    window_age_s: float | None


class AgentTail:
    """Reads `directory`/*.jsonl incrementally (one instance per demo run; not thread-safe)."""

    def __init__(self, directory: Path) -> None:
        self._directory = directory
        self._offsets: dict[Path, int] = {}
        self._partial: dict[Path, bytes] = {}
        self._steps: dict[int, list[StepReport]] = {}

    def _read_new(self, path: Path) -> None:
        try:
            with path.open("rb") as stream:
                stream.seek(self._offsets.get(path, 0))
                data = stream.read()
        except OSError:
            return
        self._offsets[path] = self._offsets.get(path, 0) + len(data)
        lines = (self._partial.pop(path, b"") + data).split(b"\n")
        if lines[-1]:
            self._partial[path] = lines[-1]  # not finished yet
        for line in lines[:-1]:
            if not line.strip():
                continue
            try:
                batch = decode_batch(line.decode("utf-8", "replace"))
            except SchemaError:
                continue  # the report says which lines it skipped; the live view just goes on
            self._steps.setdefault(batch.rank, []).extend(batch.reports)

    def poll(self) -> BreakdownStatus | None:
        """The status after reading what was appended; None before any report."""
        for path in sorted(self._directory.glob("*.jsonl")):
            self._read_new(path)
        if not self._steps:
            return None
        coverage = Coverage(tuple(rank_coverage(r, s) for r, s in sorted(self._steps.items())))
        first = coverage.ranks[0]
        latest = max(self._steps[first.rank], key=lambda s: s.step)
        window = first.latest_window_step
        if window is None:
            return BreakdownStatus(coverage, None, None, None)
        start = next(s.start_unix_ns for s in self._steps[first.rank] if s.step == window)
        return BreakdownStatus(
            coverage, window, latest.step - window, (latest.start_unix_ns - start) / 1e9
        )
