"""mfuscope.agent: runs inside every training rank.

Nothing here imports torch at package import time: the pure analysis core
(`mfuscope.agent.analysis`) is used by the collector and the offline CLI, which never import torch.
"""

from __future__ import annotations

__all__: list[str] = []
