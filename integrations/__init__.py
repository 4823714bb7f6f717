"""mfuscope.integrations: the agent wired into training frameworks, one module per framework.

- `mfuscope.integrations.huggingface.MfuscopeCallback`: a `transformers` `TrainerCallback`
  (`pip install mfuscope[huggingface]`).
- `mfuscope.integrations.lightning.MfuscopeCallback`: a Lightning `Callback`
  (`pip install mfuscope[lightning]`).
- `mfuscope.integrations.torchtitan`: a launcher that instruments torchtitan's `Trainer`.

Importing this package imports no framework (and no torch): each framework is imported by its
own module, when that module is imported. Details in docs/integrations.md.
"""

from __future__ import annotations

__all__: list[str] = []
