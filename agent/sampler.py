"""Moved to `mfuscope.agent.profiler_windows`.

This old path re-exports its names and warns; it goes in mfuscope 0.3.0.
"""

from __future__ import annotations

from mfuscope.agent.profiler_windows import (
    Keep,
    ProfilerBusy,
    ProfilerLike,
    WindowAnalyser,
    WindowOutcome,
    WindowRecorder,
    torch_profiler_busy,
    torch_profiler_factory,
)
from mfuscope.core.moved import warn_moved

__all__ = [
    "Keep",
    "ProfilerBusy",
    "ProfilerLike",
    "WindowAnalyser",
    "WindowOutcome",
    "WindowRecorder",
    "torch_profiler_busy",
    "torch_profiler_factory",
]

warn_moved(__name__, "mfuscope.agent.profiler_windows")
