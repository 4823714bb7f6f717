"""A real 2-rank gloo job killed mid-run and relaunched under the same job name from an earlier
checkpoint, both launches feeding one real collector process: the redone steps are new work (and
counted as reruns), the relaunch is one restart, and a re-sent batch still counts once."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest
from mfuscope.core.schema import decode_batch

from tests.support import agent_helpers as helpers
from tests.support.collector_process import CollectorProcess

pytestmark = pytest.mark.slow

JOB = "relaunched"
FIRST_RUN_STEPS = 12  # the first launch runs steps 0..11, hangs, and is killed ...
# ... having reported steps 0..10: a step's report goes out when the next step begins (its
# time runs from begin to begin), so the killed job's last step is never reported.
REPORTED_BEFORE_KILL = FIRST_RUN_STEPS - 1
RESUME_STEP = 8  # the relaunch resumes from the checkpoint of step 8 ...
SECOND_RUN_STEPS = 10  # ... and runs steps 8..17: 8, 9, 10 had been reported, so are redone
RANKS = 2
AGENT_OPTIONS = (
    "--option", "flush_interval_s=0.2",
    "--option", "profile=0",  # no profiled windows: this test is about counting steps
    "--option", "calibrate_cpu_peak=0",
)  # fmt: skip


def _counters(url: str) -> dict[str, float]:
    with urllib.request.urlopen(f"{url}/metrics", timeout=30) as response:
        text = response.read().decode()
    pattern = rf'^(mfuscope_[a-z_]+_total){{job="{JOB}"}} (\S+)$'
    return {name: float(value) for name, value in re.findall(pattern, text, flags=re.MULTILINE)}


def _wait_for(url: str, name: str, value: float, job: subprocess.Popen[str]) -> None:
    deadline = time.monotonic() + 240
    while _counters(url).get(name) != value:
        if job.poll() is not None:
            raise AssertionError(f"the job exited early: {job.communicate()}")
        if time.monotonic() > deadline:
            raise TimeoutError(f"{name} never reached {value}: {_counters(url)}")
        time.sleep(0.2)


def _kill(launcher: subprocess.Popen[bytes], pid_files: list[Path]) -> None:
    """SIGKILL the whole job, as a node failure would: the launcher's process group and every
    rank (in sessions of their own, as under torchrun)."""
    os.killpg(launcher.pid, signal.SIGKILL)
    for path in pid_files:
        if path.exists():
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(path.read_text()), signal.SIGKILL)
    launcher.wait(timeout=60)


def _incarnations(paths: list[Path]) -> set[str]:
    return {decode_batch(line).incarnation for p in paths for line in p.read_text().splitlines()}


def _post(url: str, body: bytes) -> None:
    request = urllib.request.Request(
        f"{url}/v1/reports", data=body, headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        assert response.status == 200


def test_killed_and_relaunched_job_counts_redone_steps_as_work_and_reruns(
    tmp_path: Path,
) -> None:
    collector = CollectorProcess(tmp_path)
    try:
        # Launch 1: trains 12 steps, then hangs; killed (SIGKILL, every process of the job)
        # once the collector has all it will get, like a node failure mid-run.
        command, env = helpers.job_command(
            tmp_path,
            "--job", JOB,
            "--collector-url", collector.url,
            "--steps", "1000",
            "--hang-after", str(FIRST_RUN_STEPS),
            "--pid-file", str(tmp_path / "launch1-{rank}.pid"),
            "--jsonl", str(tmp_path / "launch1-{rank}.jsonl"),
            *AGENT_OPTIONS,
        )  # fmt: skip
        log = (tmp_path / "launch1.log").open("w")
        first = subprocess.Popen(command, env=env, stdout=log, stderr=log, start_new_session=True)
        try:
            _wait_for(collector.url, "mfuscope_steps_total", RANKS * REPORTED_BEFORE_KILL, first)
        finally:
            _kill(first, [tmp_path / f"launch1-{rank}.pid" for rank in range(RANKS)])
            log.close()
        after_first = _counters(collector.url)

        # Launch 2, same job name: resumes from step 8 and runs to the end.
        jsonl = tmp_path / "relaunch{rank}.jsonl"
        second = helpers.run_job(
            tmp_path,
            "--job", JOB,
            "--collector-url", collector.url,
            "--jsonl", str(jsonl),
            "--steps", str(SECOND_RUN_STEPS),
            "--first-step", str(RESUME_STEP),
            "--close-timeout-s", "60",
            *AGENT_OPTIONS,
        )  # fmt: skip
        assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-3000:]
        after_second = _counters(collector.url)

        # A batch of the relaunch sent again (an agent retry whose answer was lost).
        resent = (tmp_path / "relaunch0.jsonl").read_text().splitlines()[0].encode()
        _post(collector.url, resent)
        after_resend = _counters(collector.url)
    finally:
        collector.stop()

    # Each launch has one incarnation, the same on both ranks; the relaunch a new one.
    first_ids = _incarnations([tmp_path / f"launch1-{rank}.jsonl" for rank in range(RANKS)])
    second_ids = _incarnations([tmp_path / f"relaunch{rank}.jsonl" for rank in range(RANKS)])
    assert len(first_ids) == len(second_ids) == 1 and first_ids != second_ids

    redone = RANKS * (REPORTED_BEFORE_KILL - RESUME_STEP)  # steps 8..10 of both ranks
    assert after_first["mfuscope_job_restarts_total"] == 0
    assert after_first["mfuscope_rerun_steps_total"] == 0
    assert after_first["mfuscope_steps_total"] == RANKS * REPORTED_BEFORE_KILL
    every_step = RANKS * (REPORTED_BEFORE_KILL + SECOND_RUN_STEPS)
    assert after_second["mfuscope_steps_total"] == every_step
    assert after_second["mfuscope_rerun_steps_total"] == redone
    assert after_second["mfuscope_job_restarts_total"] == 1
    assert after_second["mfuscope_reports_duplicate_total"] == 0
    # Seconds and FLOPs grew with the relaunch's steps, redone ones included.
    for name in ("mfuscope_step_seconds_total", "mfuscope_model_flops_total"):
        assert after_second[name] > after_first[name] > 0, name
    resent_reports = resent.count(b'"step":')
    assert resent_reports >= 1
    assert after_resend["mfuscope_steps_total"] == after_second["mfuscope_steps_total"]
    assert after_resend["mfuscope_reports_duplicate_total"] == resent_reports
    assert after_resend["mfuscope_rerun_steps_total"] == redone
    assert after_resend["mfuscope_job_restarts_total"] == 1
    print(
        f"relaunch counts: after launch 1 {after_first}; after launch 2 {after_second}; "
        f"after the re-send {after_resend}"
    )
