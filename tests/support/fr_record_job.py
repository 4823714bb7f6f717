"""Records the real gloo flight-recorder dumps in tests/data/flight-recorder (torch 2.13, CPU).

    OMP_NUM_THREADS=1 torchrun --standalone --nproc_per_node=2 tests/support/fr_record_job.py \
        tests/data/flight-recorder

Two ranks, a dp-like 2-rank group made with ``new_group(group_desc="DATA_PARALLEL_GROUP")`` beside
the default group: three all_reduces, an all_gather_into_tensor, a broadcast and a barrier, then
rank 1 sleeps 3 s before a fourth all_reduce. Rank 0 dumps its recorder (JSON binding) from a
second thread while it waits in that all_reduce (`gloo-rank0-waiting.json`); rank 1 dumps just
before it joins (`gloo-rank1-before.json`). Both dump once more at the end
(`gloo-rank{r}-end.json`).
"""

from __future__ import annotations

import atexit
import gc
import json
import sys
import threading
import time
from pathlib import Path

import torch
import torch._C._distributed_c10d as c10d
import torch.distributed as dist


def _dump(path: Path) -> None:
    path.write_text(json.dumps(json.loads(c10d._dump_fr_trace_json(True, False)), indent=1))


def main() -> None:
    out = Path(sys.argv[1])
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    dp = dist.new_group([0, 1], group_desc="DATA_PARALLEL_GROUP")
    x = torch.ones(256)
    for _ in range(3):
        dist.all_reduce(x, group=dp)
    dist.all_gather_into_tensor(torch.empty(512), x, group=dp)
    dist.broadcast(x, 0)
    dist.barrier()
    if rank == 0:
        timer = threading.Timer(1.5, _dump, (out / "gloo-rank0-waiting.json",))
        timer.start()
        dist.all_reduce(x, group=dp)
        timer.join()
    else:
        time.sleep(0.5)
        _dump(out / "gloo-rank1-before.json")
        time.sleep(2.5)
        dist.all_reduce(x, group=dp)
    dist.barrier()
    time.sleep(0.5)
    _dump(out / f"gloo-rank{rank}-end.json")
    dist.destroy_process_group()


if __name__ == "__main__":
    # Frozen at exit, torch's objects are skipped by the interpreter's last garbage collections
    # (about 1 s of CPU per rank otherwise, after the work and the agent's close).
    atexit.register(gc.freeze)
    main()
