"""mfuscope.collector: ingests agent reports and keeps exact, aggregatable counters. Never imports
torch or the agent.

The public names are the ones below; the modules behind them are private (`_ingest`: decode and
validate; `_aggregator`: apply, the thread-safe `Aggregator`; `_series`: the metric contract;
`_summary`: ``/v1/summary``; `_routes` and `_server`: HTTP; `_auth`, `_ratelimit`), and `app`
is the collector process (`mfuscope collector`). The wire format is `mfuscope.core.schema`.

Importing the package is cheap: the names below are resolved on first access (PEP 562), so
decoding a batch never pays for the HTTP server or the exporters' libraries.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from mfuscope.core.lazy_exports import lazy_exports

if TYPE_CHECKING:
    from mfuscope.collector._aggregator import Aggregator
    from mfuscope.collector._clock import Clock, SystemClock
    from mfuscope.collector._errors import (
        BadRequest,
        IngestError,
        PayloadTooLarge,
        RateLimited,
        Unauthorized,
        UnsupportedVersion,
    )
    from mfuscope.collector._ingest import decode_batch
    from mfuscope.collector._series import metric_families
    from mfuscope.collector._snapshot import CollectorSnapshot, JobSnapshot
    from mfuscope.collector._state import IngestResult, StateConfig
    from mfuscope.collector._summary import summary

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
    "summary",
]

_LAZY = {
    "Aggregator": "mfuscope.collector._aggregator",
    "BadRequest": "mfuscope.collector._errors",
    "Clock": "mfuscope.collector._clock",
    "CollectorSnapshot": "mfuscope.collector._snapshot",
    "IngestError": "mfuscope.collector._errors",
    "IngestResult": "mfuscope.collector._state",
    "JobSnapshot": "mfuscope.collector._snapshot",
    "PayloadTooLarge": "mfuscope.collector._errors",
    "RateLimited": "mfuscope.collector._errors",
    "StateConfig": "mfuscope.collector._state",
    "SystemClock": "mfuscope.collector._clock",
    "Unauthorized": "mfuscope.collector._errors",
    "UnsupportedVersion": "mfuscope.collector._errors",
    "decode_batch": "mfuscope.collector._ingest",
    "metric_families": "mfuscope.collector._series",
    "summary": "mfuscope.collector._summary",
}


__getattr__, __dir__ = lazy_exports(__name__, _LAZY, globals())
