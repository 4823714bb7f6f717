"""mfuscope.collector: ingests agent reports and keeps exact, aggregatable counters. Never imports
torch."""

from __future__ import annotations

__all__: list[str] = []
