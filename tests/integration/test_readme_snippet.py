"""The README's instrumentation snippet (`agent.mark_step()` with gradient accumulation), as a
user would run it: under torchrun on 2 gloo ranks, against a real collector; one report per rank
and optimizer step. Its log says what the agent does (one start-up line on rank 0 with
the peak and its source, where reports go and the window schedule; a line per analysed window)
and carries none of torch's profiler chatter (Kineto's ``USDT ... profiler_start`` lines)."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest

from tests.support.agent_helpers import job_command
from tests.support.collector_process import CollectorProcess, request

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]
STEPS = 10


def readme_snippet() -> str:
    """The first Python block of the README's "Instrumenting a training script" section."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    section = text[text.index("## Instrumenting a training script") :]
    match = re.search(r"```python\n(.*?)```", section, re.DOTALL)
    assert match is not None
    return match.group(1)


def test_the_readme_snippet_runs_and_says_what_it_measures(tmp_path: Path) -> None:
    collector = CollectorProcess(tmp_path)
    try:
        code = readme_snippet()
        assert 'collector_url="http://127.0.0.1:9464"' in code and "range(1000)" in code
        # the plain loop: one marked step per optimizer step, micro-batches accumulated in it
        assert "agent.mark_step()" in code and "model.no_sync()" in code
        # A short run against this test's collector; windows come early so one is analysed.
        code = code.replace("http://127.0.0.1:9464", collector.url)
        code = code.replace("range(1000)", f"range({STEPS})")
        script = tmp_path / "train.py"
        script.write_text(code)
        command, env = job_command(tmp_path, torchrun=True)  # as the README says to run it
        command[-1] = str(script)
        env.update(MFUSCOPE_PROFILE_FIRST_STEP="4", MFUSCOPE_PROFILE_EVERY_STEPS="10")
        job = subprocess.run(command, env=env, capture_output=True, text=True, timeout=240)
        log = job.stdout + job.stderr
        assert job.returncode == 0, log[-3000:]
        summary = json.loads(request(collector.url + "/v1/summary")[2])
    finally:
        collector.stop()
    (start,) = re.findall(r".*mfuscope: agent started.*", log)  # rank 0 only, once
    assert "job 'tiny-mlp' on 2 ranks (cpu); peak" in start
    assert "measured by a CPU matmul calibration" in start
    assert f"reports to collector {collector.url}" in start
    assert "profiled windows of 3 steps from step 4, then every 10 steps or 300 s" in start
    windows = re.findall(r".*mfuscope: profiled window, steps (\d+)-(\d+), analysed: compute", log)
    assert windows and windows[0] == ("4", "6")
    assert "USDT" not in log and "profiler_start" not in log
    (job_entry,) = summary["jobs"]
    assert job_entry["reports"]["accepted"] == 2 * STEPS
