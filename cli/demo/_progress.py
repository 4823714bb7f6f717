"""The demo job's progress lines: read them off its stdout, fold them into the live view's state.

The job (`mfuscope.cli.demo.job.train_demo`) prints `PROGRESS_PREFIX {json}` lines with an
`event` key; everything it prints also goes to `train.log`.
"""

from __future__ import annotations

import contextlib
import json
import queue
from collections.abc import Callable, Mapping
from typing import IO, Any

from mfuscope.cli.demo._live_view import DemoState
from mfuscope.cli.demo.job.train_demo import PROGRESS_PREFIX

__all__ = ["apply_event", "read_progress"]


def read_progress(stream: IO[bytes], log: IO[bytes], events: queue.Queue[dict[str, Any]]) -> None:
    """Copy the job's output to its log and pass its progress lines on (reader thread)."""
    for raw in iter(stream.readline, b""):
        try:
            log.write(raw)
            log.flush()
        except (OSError, ValueError):  # the log was closed: the demo is finishing
            return
        line = raw.decode("utf-8", "replace").rstrip("\n")
        if line.startswith(PROGRESS_PREFIX):
            with contextlib.suppress(ValueError):
                events.put(json.loads(line[len(PROGRESS_PREFIX) :]))


def apply_event(
    state: DemoState, event: Mapping[str, Any], note: Callable[[str], None], ranks: int
) -> None:
    """Fold one progress event into `state`; `note` records a line of progress for the user."""
    kind = event.get("event")
    if kind == "importing_torch":
        state.phase = "importing torch"
        note(f"importing torch in {ranks} processes (a few seconds)…")
    elif kind == "torch_ready":
        note(f"torch imported in {event.get('seconds', 0):.1f} s")
    elif kind == "process_group_ready":
        state.phase = "building the model"
        note(
            f"process group ready: {event.get('backend')}, "
            f"{event.get('world_size')} ranks, mesh {event.get('mesh')}"
        )
    elif kind == "model_ready":
        state.phase = "starting the agent"
        state.loss_floor = event.get("entropy_floor_nats")
        note(
            f"model ready: {event.get('layers')} layers, {event.get('parameters', 0):,} "
            f"parameters on rank 0, its layers {event.get('checkpointed_layers')} "
            "checkpointed; starting the agent (topology, peak calibration)…"
        )
    elif kind == "agent_ready":
        state.phase = "first steps (counting FLOPs once)"
        note(f"agent ready in {event.get('seconds', 0.0):.1f} s; training…")
    elif kind == "step":
        state.phase = "training"
        state.step = int(event.get("step", 0))
        state.loss = event.get("loss")
    elif kind == "training_done":
        state.phase = "flushing the agents' last reports"
        state.steps_done = int(event.get("steps", 0))
        note(f"training done ({event.get('steps')} steps); the agents flush…")
    elif kind == "agent_closed":
        state.phase = "torchrun exiting"
        note(f"agent on rank 0 closed in {event.get('seconds', 0.0):.1f} s")
