"""The agent's own threads: at most three per rank (docs/agent.md, "Threads"), all gone at close."""

from __future__ import annotations

import threading
from pathlib import Path

from mfuscope.agent._agent import Seams, agent_with_seams
from mfuscope.agent.flight_recorder import DumpSource
from mfuscope.core.schema import decode_batch

from tests.support.agent_fakes import FakeProfiler, step_until
from tests.support.fr_dumps import nccl_dump, nccl_entry


def _new_threads(before: set[threading.Thread]) -> list[str]:
    return sorted(t.name for t in threading.enumerate() if t not in before and t.is_alive())


def test_the_agent_adds_at_most_three_threads_and_ends_them_at_close(tmp_path: Path) -> None:
    # Everything periodic that an agent of a distributed job runs: the step reports, a flight
    # recorder (a test source standing for torch.distributed's), the hardware counters (their
    # default), and a profiled window analysed off the training thread.
    recorder = DumpSource(
        "generic", lambda: nccl_dump([nccl_entry(0, 1)]), json=False, native=False
    )
    before = set(threading.enumerate())
    agent = agent_with_seams(
        Seams(
            profiler_factory=FakeProfiler, analyse=lambda path: [], collective_sources=[recorder]
        ),
        job="threads",
        jsonl_path=str(tmp_path / "out.jsonl"),
        peak_flops=1e11,
        profile_first_step=2,
    )
    step_until(agent, lambda health: health.profiler_failures_total > 0)  # the window is over
    transport = f"mfuscope-transport(file {tmp_path / 'out.jsonl'})"
    assert _new_threads(before) == ["mfuscope-analyser", "mfuscope-periodic", transport]
    agent.close()
    assert _new_threads(before) == []
    # The collective reader and the hardware sampler did run there: their records rode along.
    batches = [decode_batch(line) for line in (tmp_path / "out.jsonl").read_text().splitlines()]
    assert any(b.comm is not None for b in batches) and any(b.hardware is not None for b in batches)
