"""Flight-recorder dumps for tests: the real gloo dumps in tests/data/flight-recorder, and NCCL
dumps built here (no GPU on the machines these tests run on).

The NCCL entries use exactly the keys PyTorch defines in
``torch/csrc/distributed/c10d/FlightRecorder.hpp`` (dump version 2.10) and fills in
``FlightRecorderDetail.hpp`` (``getCollectiveTrace``, the pickle dump), with the values torch's own
NCCL flight-recorder tests assert (``test/distributed/test_c10d_nccl.py``, ``NCCLTraceTest``): a
pickle dump holds sizes as tuples of tuples (``((3, 4),)``), ``state`` is ``completed`` once the
watchdog saw the end event, ``time_discovered_*_ns`` are None until then, ``duration_ms`` is present
only with timing on (``pg._enable_collectives_timing()`` or ``TORCH_NCCL_ENABLE_TIMING=1``), and
the profiling names are ``nccl:all_reduce``, ``nccl:all_reduce_barrier`` (``barrier``),
``nccl:send {rank}->{peer}`` / ``nccl:recv {rank}<-{peer}`` (``ProcessGroupNCCL.cpp``) and
``nccl:coalesced``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

DATA = Path(__file__).resolve().parents[1] / "data" / "flight-recorder"


def gloo_dump(name: str) -> dict[str, Any]:
    """A real gloo dump (JSON binding) recorded by `tests/support/fr_record_job.py`."""
    loaded: dict[str, Any] = json.loads((DATA / name).read_text(encoding="utf-8"))
    return loaded


def nccl_entry(
    record_id: int,
    seq: int,
    *,
    name: str = "nccl:all_reduce",
    group: tuple[str, str] = ("0", "default_pg"),
    shape: tuple[int, ...] = (3, 4),
    out_shape: tuple[int, ...] | None = None,
    dtype: str = "Float",
    created_ns: int = 1_763_700_000_000_000_000,
    duration_ms: float | None = 0.036,
    completed: bool = True,
    is_p2p: bool = False,
) -> dict[str, Any]:
    """One entry as ``_dump_nccl_trace`` (pickle) returns it."""
    entry: dict[str, Any] = {
        "record_id": record_id,
        "pg_id": int(group[0]) if group[0].isdigit() else 0,
        "process_group": group,
        "thread_name": "fr_test_thread",
        "thread_id": "140502976244608",
        "collective_seq_id": 0 if is_p2p else seq,
        "p2p_seq_id": seq if is_p2p else 0,
        "op_id": seq,
        "profiling_name": name,
        "time_created_ns": created_ns,
        "input_sizes": (shape,),
        "input_dtypes": [dtype],
        "output_sizes": ((out_shape or shape),),
        "output_dtypes": [dtype],
        "state": "completed"
        if completed
        else ("started" if duration_ms is not None else "scheduled"),
        "time_discovered_started_ns": created_ns + 1000 if duration_ms is not None else None,
        "time_discovered_completed_ns": created_ns + 50_000 if completed else None,
        "retired": completed,
        "timeout_ms": 600000,
        "is_p2p": is_p2p,
    }
    if duration_ms is not None and completed:
        entry["duration_ms"] = duration_ms
    return entry


def nccl_dump(entries: list[dict[str, Any]]) -> dict[str, Any]:
    """A whole pickle dump around `entries` (``dump`` in ``FlightRecorderDetail.hpp``)."""
    return {
        "version": "2.10",
        "pg_config": {"0": {"name": "0", "desc": "default_pg", "ranks": "[0, 1]"}},
        "comm_lib_version": "2.27.3",
        "pg_status": {
            "0": {
                "last_enqueued_collective": max(
                    (e["collective_seq_id"] for e in entries), default=0
                ),
                "last_started_collective": -1,
                "last_completed_collective": -1,
            }
        },
        "entries": entries,
    }
