"""mfuscope.agent: runs inside every training rank.

Nothing here imports torch at package import time: the pure analysis core
(`mfuscope.core.trace`) is used by the collector and the offline CLI, which never import torch.
`Agent` and `checkpoint_context` are resolved lazily on first access (PEP 562).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

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


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'mfuscope.agent' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
