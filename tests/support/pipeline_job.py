"""A 4-rank gloo job: a 2-stage `torch.distributed.pipelining` pipeline with data parallelism
beside it, instrumented with the mfuscope agent.

Run under torchrun (`tests/integration/test_pipeline_e2e.py` does):

    OMP_NUM_THREADS=1 PYTHONPATH=. torchrun --standalone --nproc_per_node=4 \
        tests/support/pipeline_job.py \
        --collector-url http://127.0.0.1:PORT --out DIR --schedules gpipe 1f1b

``init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "pp"))``: global ranks 0 and 1 form one
pipeline (stage 0, stage 1), ranks 2 and 3 the other; each stage is the same plain MLP block
(WIDTH -> 4 WIDTH -> WIDTH, fp32), run by a `PipelineStage` on the pp group under the chosen
schedule with MICRO_BATCHES micro-batches of MICRO_BATCH rows per step; the last stage's loss is
a mean squared error. After each schedule step the stage's gradients, flattened into one
tensor, are all-reduced over the dp group (the two ranks holding the same stage).

One job per `--schedules` entry (``pipe-gpipe``, ``pipe-1f1b``), one after the other in the same
process group. Each writes ``DIR/<job>-{rank}.jsonl`` and keeps its profiled window's trace in
``DIR/<job>-kept``. The agent counts FLOPs (step 0) and profiles steps PROFILED.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch
import torch.distributed as dist
from mfuscope.agent import Agent
from torch import nn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

from tests.support import job_exit

WIDTH = 64
MICRO_BATCH = 4  # rows per micro-batch
MICRO_BATCHES = 4  # per step
STAGES = 2
STEPS = 6
PROFILED = (2, 3)
SCHEDULES = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B}


def stage_module() -> nn.Module:
    return nn.Sequential(nn.Linear(WIDTH, 4 * WIDTH), nn.ReLU(), nn.Linear(4 * WIDTH, WIDTH))


def mse(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return (output - target).square().mean()


def train(schedule: str, mesh: DeviceMesh, collector_url: str, out: Path) -> None:
    job = f"pipe-{schedule}"
    stage_index = mesh["pp"].get_local_rank()
    dp = mesh["dp"].get_group()
    torch.manual_seed(stage_index)
    module = stage_module()
    stage = PipelineStage(
        module, stage_index, STAGES, torch.device("cpu"), group=mesh["pp"].get_group()
    )
    runner = SCHEDULES[schedule](stage, n_microbatches=MICRO_BATCHES, loss_fn=mse)
    optimizer = torch.optim.SGD(module.parameters(), lr=1e-3)
    data = torch.Generator().manual_seed(mesh["dp"].get_local_rank())
    inputs = torch.randn(MICRO_BATCH * MICRO_BATCHES, WIDTH, generator=data)
    targets = torch.randn(MICRO_BATCH * MICRO_BATCHES, WIDTH, generator=data)

    def step() -> None:
        optimizer.zero_grad()
        if stage_index == 0:
            runner.step(inputs)
        else:
            runner.step(target=targets)
        grads = [p.grad for p in module.parameters() if p.grad is not None]
        flat = torch.cat([g.flatten() for g in grads])
        dist.all_reduce(flat, group=dp)
        torch.nn.utils.vector_to_parameters(flat / mesh["dp"].size(), grads)
        optimizer.step()

    # No warm-up step: the schedule's first step also initialises the stages (a shape-inference
    # forward and backward of one micro-batch), which the agent neither counts nor takes for a
    # forward of the step's own.
    agent = Agent(
        job=job,
        collector_url=collector_url,
        model=module,
        mesh=mesh,
        jsonl_path=str(out / f"{job}-{{rank}}.jsonl"),
        peak_flops=1e11,  # any fixed peak: the test checks FLOPs and buckets, not the machine
        calibrate_cpu_peak=False,
        profile_first_step=PROFILED[0],
        profile_steps=len(PROFILED),
        profile_every_steps=1000,
        profile_max_overhead_ratio=1.0,
        keep_traces=1,
        keep_traces_dir=str(out / f"{job}-kept"),
        flush_interval_s=0.2,
        hardware_counters=False,
    )
    for _ in range(STEPS):
        with agent.step():
            step()
    agent.close(60.0)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--collector-url", required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--schedules", nargs="+", choices=sorted(SCHEDULES), required=True)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    mesh = init_device_mesh("cpu", (2, STAGES), mesh_dim_names=("dp", "pp"))
    for schedule in args.schedules:
        train(schedule, mesh, args.collector_url, args.out)
        dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    job_exit.freeze_at_exit()
    main()
