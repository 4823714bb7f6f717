"""How the test jobs (`tests/support/*_job.py`) end, written once: `freeze_at_exit` at their
start, `finish` after their work. Imported only inside the jobs' processes (torch is imported
when `finish` runs, not here)."""

from __future__ import annotations

import atexit
import gc
import json

__all__ = ["finish", "freeze_at_exit"]


def freeze_at_exit() -> None:
    """Freeze every object at interpreter exit: the interpreter's last garbage collections then
    skip torch's objects, which they would otherwise walk (about 1 s of CPU per rank, after the
    work and the agent's close)."""
    atexit.register(gc.freeze)


def finish(path: str | None, record: object) -> None:
    """Write `record` as JSON to `path` (``{rank}`` replaced by this rank; nothing without a
    path), wait for every rank, and destroy the default process group: no rank leaves while a
    peer still needs it."""
    import torch.distributed as dist

    if path is not None:
        with open(path.replace("{rank}", str(dist.get_rank())), "w") as handle:
            json.dump(record, handle)
    dist.barrier()
    dist.destroy_process_group()
