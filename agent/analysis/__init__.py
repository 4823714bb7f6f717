"""The pure analysis core: plain data in, plain data out; no I/O, clocks, logging or torch."""

from __future__ import annotations

from mfuscope.agent.analysis.decompose import analyze_trace
from mfuscope.agent.analysis.result import (
    AnalysisOptions,
    CollectiveRecord,
    ExposedComm,
    RankAnalysis,
    StepDecomposition,
)
from mfuscope.agent.analysis.to_json import analysis_to_json
from mfuscope.agent.analysis.trace_io import KinetoTrace, TraceError, load_trace, read_trace

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
