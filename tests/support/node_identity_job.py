"""One rank of a 2-rank gloo job that only starts the agent, runs two steps with an all_reduce
and closes, writing its batches to `--jsonl` (`{rank}` replaced): for the node-identity test.
With `--sysfs-root DIR` the agent samples hardware counters with DIR playing ``/`` (a fake
node's NICs).

Started once per rank by the test (no torchrun), so each rank can get its own environment
(``MFUSCOPE_NODE_NAME``) or its own host name (under ``unshare --uts``). Rendezvous from
``MASTER_ADDR`` / ``MASTER_PORT`` / ``RANK`` / ``WORLD_SIZE``.
"""

from __future__ import annotations

import argparse

import torch
import torch.distributed as dist
from mfuscope.agent import Agent
from mfuscope.agent._agent import Seams, agent_with_seams

from tests.support import job_exit


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--jsonl", required=True)
    parser.add_argument("--sysfs-root")
    args = parser.parse_args()
    dist.init_process_group("gloo")
    options = dict(
        job="node-identity",
        jsonl_path=args.jsonl,
        flops_per_step=1e6,
        peak_flops=1e9,
        profile=False,
        hardware_counters=args.sysfs_root is not None,
        flush_interval_s=0.0,
    )
    if args.sysfs_root is None:
        agent = Agent(**options)
    else:
        agent = agent_with_seams(Seams(sysfs_root=args.sysfs_root), **options)
    for _ in range(2):
        with agent.step():
            tensor = torch.ones(4)
            dist.all_reduce(tensor)
    agent.close(10.0)
    dist.destroy_process_group()


if __name__ == "__main__":
    job_exit.freeze_at_exit()
    main()
