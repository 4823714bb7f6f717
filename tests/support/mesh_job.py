"""A 4-rank gloo job on a 2 x 2 (dp, tp) layout, instrumented with the mfuscope agent.

Run under torchrun (`tests/integration/test_group_axes_e2e.py` does):

    OMP_NUM_THREADS=1 torchrun --standalone --nproc_per_node=4 tests/support/mesh_job.py \
        --layout mesh --collector-url http://127.0.0.1:PORT --out DIR

`--layout mesh`: ``init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))``, a DTensor MLP
(ColwiseParallel then RowwiseParallel on the tp mesh: one tp all_reduce forward, one backward),
and an explicit all_reduce of every gradient over the dp mesh group.
`--layout megatron`: the same communication on groups made the way Megatron-core makes them,
``new_group(ranks, group_desc="DATA_PARALLEL_GROUP")`` (dp groups first, as Megatron-core does)
and ``"TENSOR_MODEL_PARALLEL_GROUP"``, with a hand-written tensor-parallel MLP.

`--layout mesh_groups`: the `mesh` layout's process groups and collectives (the same calls and
sizes) without DTensor: a hand-written tensor-parallel MLP whose output is all-reduced over the tp
group in forward (Megatron-core's row-parallel reduce: identity in backward), its FLOPs per step
given to the agent and its SGD step written out. A rank then imports neither DTensor nor
torch._dynamo (which counting FLOPs and torch.optim import): seconds of CPU less per rank, for the
hang tests, which need the collectives and not the FLOPs.

`--layout mesh,megatron,fsdp_tp` runs the layouts one after the other in the same ranks, each
under an agent of its own (job ``groups-{layout}``), writing into ``DIR/{layout}``.

Every all_reduce runs on a group of n = 2 ranks. FLOPs are counted by the agent from the model
(given, in `mesh_groups`).
Each rank writes its reports to ``DIR/reports-{rank}.jsonl`` and keeps its profiled window's trace
in ``DIR/kept``.

For the collective-records tests (`tests/integration/test_collective_records_e2e.py`):
`--shape DPxTP` sets the mesh layouts' (dp, tp) sizes (2x2 on 4 ranks, 1x2 on 2), `--no-profile`
turns profiling off, `--steps N` runs N steps, and `--stall-rank R --stall-step S --resume-file F`
make rank R stop at the start of step S, before its first collective, until file F exists (at most
10 min). Before it stops, rank R writes ``DIR/stall.json``: per group description, the
collective sequence number it would enter next, counted from its own flight recorder (what the
collector's suspect series must name).

For the per-node sidecar tests (`tests/integration/prometheus/test_sidecars_e2e.py`):
`--collector-url` may list several URLs, comma-separated: rank r reports to the (r mod n)-th;
`--node-per-rank` names rank r's node ``node{r}`` (``MFUSCOPE_NODE_NAME``), so every group spans
nodes; `--step-s S` makes every rank sleep S seconds at the start of every step (a step of
known length) and `--late-rank R --late-s L` rank R L seconds more (it enters each step's
collectives late); `--read-interval S` reads the flight recorder every S seconds, and
`--status-interval S` sends a status batch every S seconds while no step completes (a rank stuck
before its first step reports first then).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.nn.functional as dist_fn
from mfuscope.agent import Agent
from torch import nn

WIDTH, HIDDEN, BATCH = 32, 64, 8
STEPS = 5
LR = 1e-3


class MLP(nn.Module):
    def __init__(self, width: int, hidden: int) -> None:
        super().__init__()
        self.up = nn.Linear(width, hidden, bias=False)
        self.down = nn.Linear(hidden, width, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(torch.relu(self.up(x)))


SHAPE = (2, 2)  # (dp, tp) of the `mesh` layout; `--shape` changes it


def _mesh_layout() -> tuple[nn.Module, dist.ProcessGroup | None, object]:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        parallelize_module,
    )

    mesh = init_device_mesh("cpu", SHAPE, mesh_dim_names=("dp", "tp"))
    model = parallelize_module(
        MLP(WIDTH, HIDDEN), mesh["tp"], {"up": ColwiseParallel(), "down": RowwiseParallel()}
    )
    return model, mesh.get_group("dp"), mesh


def _fsdp_tp_layout() -> tuple[nn.Module, dist.ProcessGroup | None, object]:
    """The torchtitan 2-D layout: DTensor TP inside, FSDP2 sharding over dp outside."""
    from torch.distributed.fsdp import fully_shard

    model, _, mesh = _mesh_layout()
    fully_shard(model, mesh=mesh["dp"])  # type: ignore[index]
    return model, None, mesh


class _MegatronMLP(nn.Module):
    """Column-parallel up, row-parallel down, the sum over tp by a differentiable all_reduce."""

    def __init__(self, tp: dist.ProcessGroup) -> None:
        super().__init__()
        self.tp = tp
        self.up = nn.Linear(WIDTH, HIDDEN // 2, bias=False)
        self.down = nn.Linear(HIDDEN // 2, WIDTH, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # torch.distributed.nn's all_reduce also all-reduces the gradient in backward.
        return dist_fn.all_reduce(self.down(torch.relu(self.up(x))), group=self.tp)


def _megatron_layout() -> tuple[nn.Module, dist.ProcessGroup | None, object]:
    rank = dist.get_rank()
    groups = {}
    for desc, layout in (
        ("DATA_PARALLEL_GROUP", ([0, 2], [1, 3])),
        ("TENSOR_MODEL_PARALLEL_GROUP", ([0, 1], [2, 3])),
    ):
        for ranks in layout:
            group = dist.new_group(ranks, group_desc=desc)
            if rank in ranks:
                groups[desc] = group
    return _MegatronMLP(groups["TENSOR_MODEL_PARALLEL_GROUP"]), groups["DATA_PARALLEL_GROUP"], None


class _ReduceForward(torch.autograd.Function):
    """All-reduce over the tp group in forward, identity in backward: each rank's gradient of the
    summed output is the whole gradient already (Megatron-core's row-parallel output reduce)."""

    @staticmethod
    def forward(ctx: object, x: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
        out = x.clone()
        dist.all_reduce(out, group=group)
        return out

    @staticmethod
    def backward(ctx: object, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return grad, None


class _RowParallelMLP(_MegatronMLP):
    """The `mesh` layout's tensor-parallel MLP by hand: the same local shards, one tp all_reduce
    (forward) per step."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = _ReduceForward.apply(self.down(torch.relu(self.up(x))), self.tp)
        return out


def _mesh_groups_layout() -> tuple[nn.Module, dist.ProcessGroup | None, object]:
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh("cpu", SHAPE, mesh_dim_names=("dp", "tp"))
    return _RowParallelMLP(mesh.get_group("tp")), mesh.get_group("dp"), mesh


LAYOUTS = {
    "mesh": _mesh_layout,
    "mesh_groups": _mesh_groups_layout,
    "megatron": _megatron_layout,
    "fsdp_tp": _fsdp_tp_layout,
}
# `mesh_groups`' FLOPs per step and rank (what the agent counts in `mesh`): five matmuls of
# BATCH x WIDTH x HIDDEN / 2: forward up and down, backward down's two and up's weight gradient.
MESH_GROUPS_FLOPS = 5 * 2 * BATCH * WIDTH * (HIDDEN // 2)


def _next_seqs() -> dict[str, int]:
    """Group description -> the collective sequence number this rank enters next, from its own
    flight recorder (read here with torch's binding, apart from mfuscope)."""
    import json

    import torch._C._distributed_c10d as c10d

    seqs: dict[str, int] = {}
    for entry in json.loads(c10d._dump_fr_trace_json(True, False)).get("entries", []):
        if not entry["is_p2p"]:
            desc = entry["process_group"][1]
            seqs[desc] = max(seqs.get(desc, 0), entry["collective_seq_id"])
    return {desc: seq + 1 for desc, seq in seqs.items()}


def _stall(resume: Path, out: Path) -> None:
    import json
    import time

    out.write_text(json.dumps(_next_seqs()))
    deadline = time.monotonic() + 600
    while not resume.exists() and time.monotonic() < deadline:
        time.sleep(0.2)


def main() -> None:
    global SHAPE
    parser = argparse.ArgumentParser()
    parser.add_argument(
        "--layout", required=True, help=f"one of {', '.join(LAYOUTS)}, or several, comma-separated"
    )
    parser.add_argument("--collector-url", required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--shape", default="2x2")
    parser.add_argument("--no-profile", action="store_true")
    parser.add_argument("--steps", type=int, default=STEPS)
    parser.add_argument("--stall-rank", type=int)
    parser.add_argument("--stall-step", type=int, default=0)
    parser.add_argument("--resume-file", type=Path)
    parser.add_argument("--node-per-rank", action="store_true")
    parser.add_argument("--late-rank", type=int)
    parser.add_argument("--late-s", type=float, default=0.0)
    parser.add_argument("--step-s", type=float, default=0.0)
    parser.add_argument("--read-interval", type=float, default=5.0)
    parser.add_argument("--status-interval", type=float, default=10.0)
    args = parser.parse_args()
    SHAPE = tuple(int(n) for n in args.shape.split("x"))  # type: ignore[assignment]
    layouts = args.layout.split(",")
    if unknown := set(layouts) - set(LAYOUTS):
        parser.error(f"unknown layout {sorted(unknown)}: choose from {', '.join(LAYOUTS)}")
    dist.init_process_group("gloo")
    for layout in layouts:
        # Several layouts run one after the other, each with an agent (job) of its own, its
        # output in a folder of its own; the ranks start once.
        train(args, layout, args.out if len(layouts) == 1 else args.out / layout)
    dist.destroy_process_group()
    # Every agent closed, the group destroyed: exit now. The interpreter's teardown of torch's
    # modules took 2-7 s per rank on the loaded 2-core test machine, and nothing in it is the job's.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def train(args: argparse.Namespace, layout: str, out: Path) -> None:
    """`args.steps` steps of `layout` under an agent of job ``groups-{layout}``."""
    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    model, dp, mesh = LAYOUTS[layout]()
    rank = dist.get_rank()
    by_hand = layout == "mesh_groups"
    if args.node_per_rank:
        os.environ["MFUSCOPE_NODE_NAME"] = f"node{rank}"
    urls = args.collector_url.split(",")
    agent = Agent(
        job=f"groups-{layout}",
        collector_url=urls[rank % len(urls)],
        jsonl_path=str(out / "reports-{rank}.jsonl"),
        mesh=mesh,
        # Counted FLOPs: each rank's own share of the sharded model (given in `mesh_groups`).
        model=None if by_hand else model,
        flops_per_step=MESH_GROUPS_FLOPS if by_hand else None,
        peak_flops=1e9,
        profile=not args.no_profile,
        profile_first_step=1,
        profile_steps=2,
        profile_every_steps=1000,
        profile_max_overhead_ratio=1.0,
        keep_traces=1,
        keep_traces_dir=str(out / "kept"),
        flush_interval_s=0.2,
        hardware_counters=False,
        collective_read_interval_s=args.read_interval,
        status_interval_s=args.status_interval,
    )
    # `mesh_groups` steps by hand: building a torch.optim optimizer imports torch._dynamo.
    optimizer = None if by_hand else torch.optim.SGD(model.parameters(), lr=LR)
    data = torch.randn(BATCH, WIDTH, generator=torch.Generator().manual_seed(rank // 2))
    for step in range(args.steps):
        with agent.step():
            time.sleep(args.step_s + (args.late_s if rank == args.late_rank else 0.0))
            if rank == args.stall_rank and step == args.stall_step and args.resume_file:
                _stall(args.resume_file, out / "stall.json")
            model.zero_grad()
            model(data).square().mean().backward()
            for p in model.parameters() if dp is not None else ():  # FSDP2 reduces its own
                grad = p.grad
                local = grad.to_local() if hasattr(grad, "to_local") else grad
                dist.all_reduce(local, group=dp)
            if optimizer is not None:
                optimizer.step()
            else:
                with torch.no_grad():
                    for p in model.parameters():
                        p.add_(p.grad, alpha=-LR)
    agent.close()


if __name__ == "__main__":
    main()
