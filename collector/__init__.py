"""mfuscope.collector: ingests agent reports and keeps exact, aggregatable counters. Never imports
torch.

Modules: `schema` (the report wire format), `ingest` (decode + apply, the `Collector` facade),
`series` (the metric contract), `summary` (``/v1/summary``), `routes` + `server` (HTTP),
`auth`, `ratelimit`, `stragglers`, `app` (configuration and the process).
"""

from __future__ import annotations

from mfuscope.collector._state import IngestResult, StateConfig
from mfuscope.collector.clock import Clock, SystemClock
from mfuscope.collector.errors import (
    BadRequest,
    IngestError,
    PayloadTooLarge,
    RateLimited,
    Unauthorized,
    UnsupportedVersion,
)
from mfuscope.collector.ingest import Collector, decode_batch
from mfuscope.collector.series import metric_families
from mfuscope.collector.snapshot import CollectorSnapshot, JobSnapshot
from mfuscope.collector.summary import summary

__all__ = [
    "BadRequest",
    "Clock",
    "Collector",
    "CollectorSnapshot",
    "IngestError",
    "IngestResult",
    "JobSnapshot",
    "PayloadTooLarge",
    "RateLimited",
    "StateConfig",
    "SystemClock",
    "Unauthorized",
    "UnsupportedVersion",
    "decode_batch",
    "metric_families",
    "summary",
]
