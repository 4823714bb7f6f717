"""Stand-ins shared by the agent's unit tests (``from tests.support.agent_fakes import ...``).

- `Record`, `Decomposition`: engine results with only the fields the agent reads
  (`mfuscope.core.step_report.DecompositionLike`); every bucket defaults to 0 s. `Exposed` is the
  engine's own `ExposedComm`.
- `FakeProfiler`: the part of `torch.profiler.profile` the window recorder uses; it logs the
  calls it gets and can fail on `start` or `export`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from mfuscope.core.trace.result import ExposedComm as Exposed

__all__ = ["EMPTY_TRACE", "Decomposition", "Exposed", "FakeProfiler", "Record"]

EMPTY_TRACE = '{"traceEvents": []}'


@dataclass(frozen=True)
class Record:
    op: str
    axis: str
    tier: str
    group_size: int
    bytes: int | None
    seconds: float
    overlapped_ratio: float


@dataclass(frozen=True)
class Decomposition:
    step: int
    wall_s: float
    compute_s: float
    recompute_s: float = 0.0
    exposed_comm_s: float = 0.0
    other_s: float = 0.0
    bubble_pipeline_s: float = 0.0
    bubble_idle_s: float = 0.0
    overlapped_comm_s: float = 0.0
    exposed_comm: tuple[Exposed, ...] = ()
    collectives: tuple[Record, ...] = ()


class FakeProfiler:
    def __init__(self, log: list[str] | None = None, fail: str = "") -> None:
        self.log = [] if log is None else log
        self.fail = fail

    def start(self) -> None:
        self.log.append("start")
        if self.fail == "start":
            raise RuntimeError("injected start failure")

    def stop(self) -> None:
        self.log.append("stop")

    def export_chrome_trace(self, path: str) -> None:
        self.log.append("export")
        if self.fail == "export":
            raise RuntimeError("injected export failure")
        Path(path).write_text(EMPTY_TRACE)
