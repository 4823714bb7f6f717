"""The pure analysis core: plain data in, plain data out; no I/O, clocks, logging or torch."""

from __future__ import annotations

from mfuscope.core.errors import TraceError
from mfuscope.core.trace.decompose import analyze_trace
from mfuscope.core.trace.result import (
    AnalysisOptions,
    CollectiveRecord,
    ExposedComm,
    RankAnalysis,
    StepDecomposition,
)
from mfuscope.core.trace.to_json import analysis_to_json
from mfuscope.core.trace.trace_io import KinetoTrace, load_trace, read_trace

__all__: list[str] = [
    "AnalysisOptions",
    "CollectiveRecord",
    "ExposedComm",
    "KinetoTrace",
    "RankAnalysis",
    "StepDecomposition",
    "TraceError",
    "analysis_to_json",
    "analyze_trace",
    "load_trace",
    "read_trace",
]
