"""mfuscope.exporters: Prometheus exposition and OTLP export of the collector's series.

The data model (`MetricFamily` and its samples) lives here; the renderers are the submodules
`mfuscope.exporters.prometheus` (prometheus-client) and `mfuscope.exporters.otlp`
(opentelemetry-sdk, OTLP/HTTP), imported on demand so neither library loads unless used.
"""

from __future__ import annotations

from mfuscope.exporters.model import HistogramSample, MetricFamily, MetricKind, Sample

__all__ = ["HistogramSample", "MetricFamily", "MetricKind", "Sample"]
