"""The pure analysis core: plain data in, plain data out; no I/O, clocks, logging or torch.

The names below load on first use (PEP 562), so that importing one submodule (the trace reader,
`trace_io`, which needs no numpy) does not load the whole engine and numpy with it:
`mfuscope analyze` reads its first trace while they load on another thread.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from mfuscope.core.errors import TraceError

if TYPE_CHECKING:
    from mfuscope.core.trace._collectives import BOOKKEEPING, dtype_size, normalise_op
    from mfuscope.core.trace.decompose import analyze_trace
    from mfuscope.core.trace.result import (
        AnalysisOptions,
        CollectiveRecord,
        CommSpan,
        ExposedComm,
        RankAnalysis,
        StepDecomposition,
    )
    from mfuscope.core.trace.to_json import analysis_to_json
    from mfuscope.core.trace.trace_io import KinetoTrace, load_trace, read_trace

__all__: list[str] = [
    "BOOKKEEPING",
    "AnalysisOptions",
    "CollectiveRecord",
    "CommSpan",
    "ExposedComm",
    "KinetoTrace",
    "RankAnalysis",
    "StepDecomposition",
    "TraceError",
    "analysis_to_json",
    "analyze_trace",
    "dtype_size",
    "load_trace",
    "normalise_op",
    "read_trace",
]

# name -> the submodule that defines it
_HOMES = {
    # the collective vocabulary the flight records share with traces (`core.flight_records`)
    "BOOKKEEPING": "_collectives",
    "dtype_size": "_collectives",
    "normalise_op": "_collectives",
    "AnalysisOptions": "result",
    "CollectiveRecord": "result",
    "CommSpan": "result",
    "ExposedComm": "result",
    "RankAnalysis": "result",
    "StepDecomposition": "result",
    "analysis_to_json": "to_json",
    "analyze_trace": "decompose",
    "KinetoTrace": "trace_io",
    "load_trace": "trace_io",
    "read_trace": "trace_io",
}


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{home}"), name)
    globals()[name] = value  # later look-ups skip this function
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
