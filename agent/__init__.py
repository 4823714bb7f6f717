"""mfuscope.agent: runs inside every training rank.

Nothing here imports torch at package import time: the pure analysis core
(`mfuscope.core.trace`) is used by the collector and the offline CLI, which never import torch.
`Agent` and `checkpoint_context` are resolved lazily on first access (PEP 562).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from mfuscope.core._lazy import lazy_exports

if TYPE_CHECKING:
    from mfuscope.agent._agent import Agent
    from mfuscope.agent.config import AgentConfig
    from mfuscope.agent.recompute import checkpoint_context, wrap_checkpoint
    from mfuscope.core.errors import ConfigError

__all__ = ["Agent", "AgentConfig", "ConfigError", "checkpoint_context", "wrap_checkpoint"]

_LAZY = {
    "Agent": "mfuscope.agent._agent",
    "AgentConfig": "mfuscope.agent.config",
    "ConfigError": "mfuscope.core.errors",
    "checkpoint_context": "mfuscope.agent.recompute",
    "wrap_checkpoint": "mfuscope.agent.recompute",
}


__getattr__, __dir__ = lazy_exports(__name__, _LAZY, globals())
