"""mfuscope.collector: ingests agent reports and keeps exact, aggregatable counters. Never imports
torch or the agent.

Modules: `ingest` (decode + validate), `aggregator` (apply, the thread-safe `Aggregator`),
`series` (the metric contract), `summary` (``/v1/summary``), `routes` + `server` (HTTP), `auth`,
`ratelimit`, `app` (configuration and the process). The wire format is `mfuscope.core.schema`.

Importing the package is cheap: the names below are resolved on first access (PEP 562), so
`import mfuscope.collector.ingest` never pays for the HTTP server or the exporters' libraries.
The ``/v1/summary`` document is `mfuscope.collector.summary.summary` (not re-exported here: a
lazy name equal to its submodule's would be shadowed by the submodule once that is imported).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from mfuscope.core.lazy_exports import lazy_exports

if TYPE_CHECKING:
    from mfuscope.collector._state import IngestResult, StateConfig
    from mfuscope.collector.aggregator import Aggregator
    from mfuscope.collector.clock import Clock, SystemClock
    from mfuscope.collector.errors import (
        BadRequest,
        IngestError,
        PayloadTooLarge,
        RateLimited,
        Unauthorized,
        UnsupportedVersion,
    )
    from mfuscope.collector.ingest import decode_batch
    from mfuscope.collector.series import metric_families
    from mfuscope.collector.snapshot import CollectorSnapshot, JobSnapshot

__all__ = [
    "Aggregator",
    "BadRequest",
    "Clock",
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
]

_LAZY = {
    "Aggregator": "mfuscope.collector.aggregator",
    "BadRequest": "mfuscope.collector.errors",
    "Clock": "mfuscope.collector.clock",
    "CollectorSnapshot": "mfuscope.collector.snapshot",
    "IngestError": "mfuscope.collector.errors",
    "IngestResult": "mfuscope.collector._state",
    "JobSnapshot": "mfuscope.collector.snapshot",
    "PayloadTooLarge": "mfuscope.collector.errors",
    "RateLimited": "mfuscope.collector.errors",
    "StateConfig": "mfuscope.collector._state",
    "SystemClock": "mfuscope.collector.clock",
    "Unauthorized": "mfuscope.collector.errors",
    "UnsupportedVersion": "mfuscope.collector.errors",
    "decode_batch": "mfuscope.collector.ingest",
    "metric_families": "mfuscope.collector.series",
}


__getattr__, __dir__ = lazy_exports(__name__, _LAZY, globals())
