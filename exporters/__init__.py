"""mfuscope.exporters: Prometheus exposition and OTLP export of the collector's series."""

from __future__ import annotations

__all__: list[str] = []
