"""Moved to `mfuscope.core.run_summary`.

The package had no names of its own (its submodules held them), so this old path exports none;
importing it warns, and it goes in mfuscope 0.3.0. Its submodules `run`, `decompose`, `bandwidth`
and `stragglers` re-export their new modules' names.
"""

from __future__ import annotations

from mfuscope.core.moved import warn_moved

__all__: list[str] = []

warn_moved(__name__, "mfuscope.core.run_summary")
