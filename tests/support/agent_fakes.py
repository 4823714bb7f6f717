"""Stand-ins shared by the agent's unit tests (``from tests.support.agent_fakes import ...``).

- `Record`, `Decomposition`: engine results with only the fields the agent reads
  (`mfuscope.core.step_report.DecompositionLike`); every bucket defaults to 0 s. `Exposed` is the
  engine's own `ExposedComm`.
- `FakeProfiler`: the part of `torch.profiler.profile` the window recorder uses; it logs the
  calls it gets and can fail on `start` or `export`.
- `jsonl_agent`: an agent that writes its batches to a JSONL file (profiling off by default).
- `step_until`: empty steps until the agent's health says so (a window analysed, or failed).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mfuscope.core.trace.result import ExposedComm as Exposed

from tests.support.waiting import HANG_S, wait_until

if TYPE_CHECKING:
    from mfuscope.agent import Agent
    from mfuscope.agent._agent import Seams
    from mfuscope.core.schema import AgentHealth

__all__ = [
    "EMPTY_TRACE",
    "Decomposition",
    "Exposed",
    "FakeProfiler",
    "Record",
    "jsonl_agent",
    "step_until",
]

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


def jsonl_agent(
    tmp_path: Path, model: Any = None, seams: Seams | None = None, **options: Any
) -> Agent:
    """An agent writing to `tmp_path/out.jsonl` (flushed at close), profiling off, 1e11 FLOP/s
    peak; `options` override those; `seams` given: built through `agent_with_seams`."""
    # Imported here, not with the module: core's tests use this module without the agent.
    from mfuscope.agent._agent import Agent, agent_with_seams

    defaults: dict[str, Any] = {
        "job": "unit",
        "jsonl_path": str(tmp_path / "out.jsonl"),
        "peak_flops": 1e11,
        "profile": False,
        "flush_interval_s": 60.0,
    }
    defaults.update(options)
    if seams is not None:
        return agent_with_seams(seams, model=model, **defaults)
    return Agent(model=model, **defaults)


def step_until(
    agent: Agent,
    done: Callable[[AgentHealth], bool],
    *,
    max_steps: int = 10_000,
    timeout_s: float = HANG_S,
) -> int:
    """Take empty steps until `done(agent.health.snapshot())`; returns the steps taken. While a
    window is analysed off-thread no step is taken: the helper waits for the analyser's outcome,
    which the next step's end picks up. Fails after `max_steps` steps, or when one analysis
    takes longer than `timeout_s` (a bound on a broken analyser, not a measured window)."""
    runtime = agent._runtime
    assert runtime is not None, "the agent is disabled"
    analyser = runtime.analyser
    for taken in range(max_steps):
        if done(agent.health.snapshot()):
            return taken
        with agent.step():
            pass
        wait_until(lambda: not analyser.busy or analyser.ready, "the window's analysis", timeout_s)
    raise AssertionError(f"not done after {max_steps} steps: {agent.health.snapshot()}")
