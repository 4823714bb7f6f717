"""Which process group each gloo worker thread works for, as carried by a trace.

A gloo collective is recorded on one of its group's ``pt_gloo_runloop`` worker threads, and the
annotation does not name the group (docs/analyze.md, "Groups of gloo collectives"). The live
agent discovers the thread -> group map in the training process and writes it into the traces it
keeps, under a top-level ``mfuscope`` object, so that ``mfuscope analyze`` of a kept trace splits
it exactly as the agent did:

    {"mfuscope": {"gloo_worker_groups": {"<thread id>": "<process-group name>", ...}}, ...}

Thread ids are the trace's ``tid`` (Linux thread ids) as decimal strings (JSON keys are strings);
group names are those of ``distributedInfo.pg_config`` (``pg_name``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["TRACE_KEY", "WORKER_GROUPS_KEY", "trace_fields", "worker_groups_from_trace"]

TRACE_KEY = "mfuscope"
WORKER_GROUPS_KEY = "gloo_worker_groups"


def trace_fields(worker_groups: Mapping[int, str]) -> dict[str, Any]:
    """The value of the trace's top-level `TRACE_KEY` that carries `worker_groups`."""
    return {WORKER_GROUPS_KEY: {str(tid): name for tid, name in sorted(worker_groups.items())}}


def worker_groups_from_trace(extra: Any) -> dict[int, str] | None:
    """The map in a trace's `TRACE_KEY` value; None when absent, empty or malformed (then the
    trace is read as one without it)."""
    if not isinstance(extra, Mapping):
        return None
    raw = extra.get(WORKER_GROUPS_KEY)
    if not isinstance(raw, Mapping) or not raw:
        return None
    groups: dict[int, str] = {}
    for key, name in raw.items():
        if not isinstance(key, str) or not key.isdigit() or not isinstance(name, str):
            return None
        groups[int(key)] = name
    return groups
