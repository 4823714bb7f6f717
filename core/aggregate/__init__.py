"""Moved to `mfuscope.core.run_summary`.

This old path re-exports its names and warns; it goes in mfuscope 0.3.0.
"""

from __future__ import annotations

from mfuscope.core._moved import warn_moved

__all__: list[str] = []

warn_moved(__name__, "mfuscope.core.run_summary")
