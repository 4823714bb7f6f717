"""One mfuscope step per optimizer step, driven by a framework's callback events.

Frameworks announce micro-batches and optimizer steps through different hooks; what they share
is handled here: the `Agent` is created on every rank when training starts (construction is
collective under torch.distributed, see docs/agent.md), a step opens at the first micro-batch of
an optimizer step and closes after that optimizer step, so its wall time and its FLOPs (counted
over the whole step) cover every micro-batch of the accumulation cycle, and the agent is closed
when training ends. Between steps the framework's evaluations and checkpoints are phases of the
job-time ledger (`begin_phase` / `end_phase`, docs/definitions.md#job-time-ledger): at most one
is open, and a step or another phase ends it. Imports the agent (and so torch) only when
training starts.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from typing import Any

__all__ = ["AgentDriver", "framework_missing"]


def framework_missing(package: str, extra: str) -> ImportError:
    """The error raised when an integration's framework is not installed."""
    return ImportError(
        f"mfuscope.integrations.{extra} needs {package}: pip install 'mfuscope[{extra}]'"
    )


class AgentDriver:
    """Holds the agent options until training starts, then the `Agent` and the open step.

    `agent_options` are `Agent(...)` keywords (docs/agent.md). Precedence, for every option:
    the user's keyword > `MFUSCOPE_<NAME>` > what the integration derives > the default
    (`mfuscope.core.settings`).
    """

    def __init__(self, agent_options: Mapping[str, Any]) -> None:
        self.options = dict(agent_options)
        self.agent: Any = None  # mfuscope.agent.Agent once started
        self._step: contextlib.AbstractContextManager[Any] | None = None
        self._phase: contextlib.AbstractContextManager[Any] | None = None

    @property
    def in_step(self) -> bool:
        return self._step is not None

    def option(self, name: str) -> Any:
        """What the user set option `name` to (keyword, else `MFUSCOPE_<NAME>`, else the
        default), for deriving a value only when the user's options call for it."""
        from mfuscope.agent.config import AgentConfig

        return AgentConfig.option(name, self.options)

    def start(self, *, model: Any, default_job: str | None, **framework: Any) -> None:
        """Create the Agent (on every rank: collective). `framework` holds options the
        integration derives (e.g. `flops_per_step`) and `default_job` the job name it derives:
        both apply only where the user set neither the keyword nor the environment variable."""
        if self.agent is not None:
            return
        from mfuscope.agent import Agent

        derived = {**framework, "job": default_job}
        options = {"model": model, **self.options}
        self.agent = Agent(**options, derived=derived)

    def begin_step(self) -> None:
        """Open a step unless one is open (the first micro-batch of an optimizer step)."""
        if self.agent is None or self._step is not None:
            return
        self.end_phase()
        step = self.agent.step()
        step.__enter__()
        self._step = step

    def end_step(self) -> None:
        """Close the open step (after its optimizer step)."""
        step, self._step = self._step, None
        if step is not None:
            step.__exit__(None, None, None)

    def begin_phase(self, name: str) -> None:
        """Open phase `name` (`agent.phase`), ending an open one; nothing inside a step."""
        if self.agent is None or self._step is not None:
            return
        self.end_phase()
        phase = self.agent.phase(name)
        phase.__enter__()
        self._phase = phase

    def end_phase(self) -> None:
        """Close the open phase, if any."""
        phase, self._phase = self._phase, None
        if phase is not None:
            phase.__exit__(None, None, None)

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """`begin_phase` ... `end_phase` around a block (a framework call being wrapped)."""
        self.begin_phase(name)
        try:
            yield
        finally:
            self.end_phase()

    def close(self) -> None:
        """End an open step or phase (training stopped inside one) and flush the agent;
        idempotent."""
        self.end_phase()
        self.end_step()
        agent, self.agent = self.agent, None
        if agent is not None:
            agent.close()
