"""mfuscope.core: the pure, torch-free heart of mfuscope.

Every quantity mfuscope reports is defined here once (see docs/definitions.md) and the agent, the
collector and the CLI call these definitions: the wire schema (`schema`), the vocabulary
(`vocabulary`), the errors (`errors`), settings precedence (`settings`), MFU/HFU and the waterfall
(`mfu`), bus bandwidth (`bandwidth`), the alpha-beta link model, what-if and fit (`comm_model`,
`comm_fit`), analytical FLOPs (`flops`), hardware peaks and link tiers (`hardware`,
`interconnects`), stragglers (`stragglers`), engine result -> step report (`step_report`), the
report's summary of a run (`run_summary`), and trace reading and decomposition (`trace`).

Importing this package loads nothing: import the submodule you need. No module here imports
torch, a server, or reads the environment; only `trace` reads files.
"""

from __future__ import annotations

__all__: list[str] = []
