"""The pure analysis core: plain data in, plain data out; no I/O, clocks, logging or torch."""

from __future__ import annotations

__all__: list[str] = []
