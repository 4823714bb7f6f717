"""mfuscope.core: the pure, torch-free heart of mfuscope.

Every quantity mfuscope reports is defined here once (see docs/definitions.md) and the agent, the
collector and the CLI call these definitions: the wire schema (`schema`), the vocabulary
(`vocabulary`), MFU/HFU and the waterfall (`mfu`), bus bandwidth (`bandwidth`), the alpha-beta
link model and what-if (`comm_model`), analytical FLOPs (`flops`), hardware peaks and link tiers
(`hardware`, `links`), stragglers (`stragglers`), and trace reading and decomposition (`trace`).

Importing this package loads nothing: import the submodule you need. No module here imports
torch, a server, or reads the environment; only `trace` reads files.
"""

from __future__ import annotations

__all__: list[str] = []
