"""mfuscope.agent: runs inside every training rank.

Nothing here imports torch at package import time: the pure analysis core
(`mfuscope.core.trace`) is used by the collector and the offline CLI, which never import torch.
The names in `__all__` are resolved lazily on first access (PEP 562).

Importing the package asks PyTorch for its flight recorder (``TORCH_FR_BUFFER_SIZE=2000`` when
the user set no size, and unless ``MFUSCOPE_COLLECTIVE_RECORDS`` is off): PyTorch reads the size
when the first process group is created, which is usually before an `Agent` exists
(docs/agent.md, "Collective records").
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from mfuscope.agent.flight_recorder import enable_flight_recorder
from mfuscope.core.lazy_exports import lazy_exports
from mfuscope.core.settings import parse_bool

if TYPE_CHECKING:
    from mfuscope.agent._agent import Agent
    from mfuscope.agent._health import RateLimitedLog
    from mfuscope.agent._recompute import checkpoint_context, wrap_checkpoint
    from mfuscope.agent.config import AgentConfig
    from mfuscope.core.errors import ConfigError

__all__ = [
    "Agent",
    "AgentConfig",
    "ConfigError",
    "RateLimitedLog",
    "checkpoint_context",
    "wrap_checkpoint",
]

_LAZY = {
    "Agent": "mfuscope.agent._agent",
    "AgentConfig": "mfuscope.agent.config",
    "ConfigError": "mfuscope.core.errors",
    # the log the agent's parts (`hwcounters.build_hardware_sampler`, ...) take
    "RateLimitedLog": "mfuscope.agent._health",
    "checkpoint_context": "mfuscope.agent._recompute",
    "wrap_checkpoint": "mfuscope.agent._recompute",
}


__getattr__, __dir__ = lazy_exports(__name__, _LAZY, globals())


def _records_wanted() -> bool:
    try:
        return parse_bool(os.environ.get("MFUSCOPE_COLLECTIVE_RECORDS", "1") or "1")
    except ValueError:  # a bad value is reported, once, when the Agent reads its options
        return True


if _records_wanted():
    enable_flight_recorder()
