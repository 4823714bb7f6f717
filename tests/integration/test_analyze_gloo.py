"""A real 2-rank gloo DDP job profiled with torch.profiler, its traces analysed end to end.

The job (written to a temp dir and run on 2 ranks by ``tests/support/launch.py``) trains a small
MLP under DDP with one block checkpointed (its recomputation wrapped in ``mfuscope::recompute`` by
``context_fn``, as the agent does), then an all_gather and a send/recv per step. The traces go
through the real ``mfuscope analyze --json`` command; the checks compare the result with what
the job did and with the raw gloo events of the same traces.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
from mfuscope.core.trace import analyze_trace, load_trace

from tests.support.launch import job_command

pytestmark = pytest.mark.slow

STEPS = 3
WORKER = textwrap.dedent(
    """
    import contextlib, sys
    import torch, torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP
    from torch.profiler import ProfilerActivity, profile, record_function, schedule
    from torch.utils.checkpoint import checkpoint

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a = torch.nn.Linear(256, 512)
            self.b = torch.nn.Sequential(torch.nn.Linear(512, 512), torch.nn.ReLU())
            self.c = torch.nn.Linear(512, 256)

        def forward(self, x):
            x = torch.relu(self.a(x))
            recompute = lambda: record_function("mfuscope::recompute")
            x = checkpoint(
                self.b, x, use_reentrant=False,
                context_fn=lambda: (contextlib.nullcontext(), recompute()),
            )
            return self.c(x)

    def main(out):
        dist.init_process_group("gloo")
        rank = dist.get_rank()
        torch.manual_seed(rank)
        model = DDP(Net())
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        x, y = torch.randn(64, 256), torch.randn(64, 256)
        with profile(activities=[ProfilerActivity.CPU],
                     schedule=schedule(wait=1, warmup=1, active=%(steps)d),
                     record_shapes=True) as prof:
            for _ in range(2 + %(steps)d):
                opt.zero_grad()
                torch.nn.functional.mse_loss(model(x), y).backward()
                opt.step()
                gathered = torch.empty(2 * 1000)
                dist.all_gather_into_tensor(gathered, torch.ones(1000))
                if rank == 0:
                    dist.send(torch.ones(10), 1)
                else:
                    dist.recv(torch.empty(10), 0)
                prof.step()
        prof.export_chrome_trace(f"{out}/rank{rank}.json")
        dist.barrier()
        dist.destroy_process_group()

    main(sys.argv[1])
    """
) % {"steps": STEPS}
PARAM_BYTES = 4 * (256 * 512 + 512 + 512 * 512 + 512 + 512 * 256 + 256)


@pytest.fixture(scope="module")
def traces(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("gloo_traces")
    script = out / "worker.py"
    script.write_text(WORKER)
    command, env = job_command(script, str(out), temp=out / "tmp")
    env["PYTHONWARNINGS"] = "ignore"
    done = subprocess.run(command, capture_output=True, text=True, timeout=300, env=env, cwd=out)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert sorted(p.name for p in out.glob("rank*.json")) == ["rank0.json", "rank1.json"]
    return out


def _analyze(paths: list[Path], *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "mfuscope.cli", "analyze", *map(str, paths), *extra],
        capture_output=True,
        text=True,
        timeout=120,
    )


def _gloo_durations(path: Path) -> list[tuple[str, float]]:
    events = json.loads(path.read_text())["traceEvents"]
    return sorted(
        (e["name"].removeprefix("gloo:"), e["dur"] * 1e-6)
        for e in events
        if e.get("cat") == "user_annotation" and e["name"].startswith("gloo:")
    )


def test_gloo_ddp_job_is_decomposed_end_to_end(traces: Path) -> None:
    done = _analyze([traces], "--json", "--model-flops-per-step", "1e9", "--peak-flops", "1e11")
    assert done.returncode == 0, done.stderr
    doc: dict[str, Any] = json.loads(done.stdout)
    assert doc["schema"] == "mfuscope.analysis/1"
    assert [(r["rank"], r["world_size"], r["device"]) for r in doc["ranks"]] == [
        (0, 2, "cpu"),
        (1, 2, "cpu"),
    ]
    for rank in doc["ranks"]:
        steps = rank["steps"]
        assert len(steps) == STEPS
        assert [s["step"] for s in steps] == sorted(s["step"] for s in steps)
        for s in steps:
            parts = [s[k] for k in ("compute_s", "recompute_s", "exposed_comm_s", "other_s")]
            assert math.isclose(math.fsum([*parts, s["bubble_s"]]), s["wall_s"], rel_tol=1e-9)
            assert s["compute_s"] > 0 and s["recompute_s"] > 0  # the checkpointed block
            assert s["exposed_comm_s"] > 0  # all_gather / send / recv wait on the peer
            assert s["other_s"] == 0.0 and s["bubble_pipeline_s"] == 0.0
            assert s["hfu"] is None  # recompute FLOPs were not given
            # The FLOPs and peak passed above are arbitrary numbers, so MFU may exceed 1 here.
            assert math.isclose(s["mfu"], 1e9 / (1e11 * s["wall_s"]))
            by_op: dict[str, list[dict[str, Any]]] = {}
            for c in s["collectives"]:
                by_op.setdefault(c["op"], []).append(c)
                assert (c["axis"], c["tier"], c["group_size"]) == ("world", "intra_node", 2)
                assert 0.0 <= c["overlapped_ratio"] <= 1.0
            # DDP reduces every gradient once per step, however it buckets them.
            assert sum(c["bytes"] for c in by_op["all_reduce"]) == PARAM_BYTES
            (gather,) = by_op["all_gather"]
            assert gather["bytes"] == 2 * 1000 * 4  # the gathered array, nccl-tests S
            p2p = by_op["send" if rank["rank"] == 0 else "recv"]
            assert [c["bytes"] for c in p2p] == [40]


def test_collective_times_are_the_gloo_work_items_of_the_trace(traces: Path) -> None:
    for path in sorted(traces.glob("rank*.json")):
        rank = analyze_trace(load_trace(path))
        got = sorted((c.op, c.seconds) for s in rank.steps for c in s.collectives)
        # The profiled window holds exactly the steps' gloo work, barrier aside.
        raw = [(op, sec) for op, sec in _gloo_durations(path) if op != "barrier"]
        assert [op for op, _ in got] == [op for op, _ in raw]
        for (_, a), (_, b) in zip(got, raw, strict=True):
            assert math.isclose(a, b, rel_tol=1e-9)


def test_table_output_for_the_job(traces: Path) -> None:
    done = _analyze([traces])
    assert done.returncode == 0, done.stderr
    assert "rank 0/2  device: cpu" in done.stdout and "rank 1/2  device: cpu" in done.stdout
    assert "all_reduce" in done.stdout and "recv" in done.stdout
