"""`mfuscope demo` for real: a collector, a 2-rank gloo torchrun job with the agent, the report.

Each run carries a unique marker in its environment, which every process it starts inherits; after
the demo exits no process with that marker may remain. `TMPDIR` points into the test's directory,
so the demo's temporary files can be checked to be gone too.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest
from mfuscope.cli.report.writer import PLOT_NAMES

pytestmark = pytest.mark.slow
TIMEOUT_S = 240


def _demo_env(tmp_path: Path) -> tuple[dict[str, str], str]:
    marker = f"mfuscope-test-{uuid.uuid4().hex}"
    tmpdir = tmp_path / "tmp"
    tmpdir.mkdir()
    env = {**os.environ, "MFUSCOPE_TEST_MARKER": marker, "TMPDIR": str(tmpdir)}
    env["OMP_NUM_THREADS"] = "1"
    return env, marker


def _marked_processes(marker: str) -> list[int]:
    needle = f"MFUSCOPE_TEST_MARKER={marker}".encode()
    found = []
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            if needle in (entry / "environ").read_bytes().split(b"\0"):
                found.append(int(entry.name))
        except OSError:
            continue
    return found


def _assert_nothing_left(marker: str, tmp_path: Path) -> None:
    deadline = time.monotonic() + 5.0  # the kernel may need a moment to reap
    while (left := _marked_processes(marker)) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert left == [], f"processes left behind: {left}"
    assert list((tmp_path / "tmp").iterdir()) == [], "temporary files left behind"


def _demo(*args: str) -> list[str]:
    # Port 0: parallel test workers must not fight over the default port.
    return [sys.executable, "-m", "mfuscope.cli", "demo", "--no-live", "--listen", "127.0.0.1:0",
            *args]  # fmt: skip


def _run_demo(tmp_path: Path, *args: str) -> tuple[subprocess.CompletedProcess[str], Path, str]:
    env, marker = _demo_env(tmp_path)
    out = tmp_path / "out"
    result = subprocess.run(
        _demo("--out", str(out), *args),
        env=env,
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    _assert_nothing_left(marker, tmp_path)
    return result, out, marker


def _check_outputs(out: Path, steps: int, log: str) -> dict[str, object]:
    for name in ("summary.json", "metrics.txt", "report/report.html"):
        assert (out / name).exists(), f"{name} missing; demo output:\n{log[-4000:]}"
    summary = json.loads((out / "summary.json").read_text())
    (job,) = summary["jobs"]
    # The collector heard from every rank, every step.
    assert (job["ranks"], job["world_size"]) == (2, 2)
    assert job["reports"]["accepted"] == 2 * steps
    metrics = (out / "metrics.txt").read_text()
    for rank in (0, 1):
        assert re.search(rf'mfuscope_steps_total\{{job="demo",rank="{rank}"\}} {steps}\.0', metrics)
        assert (out / "agent" / f"rank{rank}.jsonl").stat().st_size > 0
    html = (out / "report" / "report.html").read_text()
    for plot in PLOT_NAMES:
        if plot == "kernel_classes":  # a CPU (gloo) timeline has no kernels to class
            assert re.search(rf'<figure id="plot-{plot}"><p class="missing">', html), plot
            continue
        assert re.search(rf'<figure id="plot-{plot}">\s*<svg', html), plot
        assert (out / "report" / f"{plot}.png").exists(), plot
    return dict(job)


def _check_one_story(out: Path, stdout: str) -> None:
    """The terminal, summary.json and the report give the same counts of measured and carried
    steps, and the same straggler ratio (the collector's), named only past the threshold."""
    summary = json.loads((out / "summary.json").read_text())
    agents = summary["agent_output"]
    cov = agents["breakdowns"]
    assert cov["windows"] >= 1 and cov["measured_steps"] > 0 and cov["carried_steps"] > 0
    said = re.search(r"breakdowns: (\d+) profiled windows? measured .*?(\d+) rank-steps; "
                     r"(\d+) rank-steps carry", stdout)  # fmt: skip
    assert said is not None, stdout
    assert [int(n) for n in said.groups()] == [
        cov["windows"], cov["measured_steps"], cov["carried_steps"]
    ]  # fmt: skip
    html = (out / "report" / "report.html").read_text()
    assert f"{cov['measured_steps']} rank-steps</b>" in html  # the "breakdowns measured" card
    (collector,) = summary["jobs"]
    ratio = collector["stragglers"][0]["ratio"]
    slowest = collector["stragglers"][0]["rank"]
    assert agents["stragglers"]["ratios"][0] == {"rank": slowest, "ratio": pytest.approx(ratio)}
    assert f"<td>rank {slowest}</td>" in html and f"<td>{ratio:.3f}</td>" in html
    if ratio > agents["stragglers"]["threshold"]:
        assert f"stragglers: rank {slowest} ×{ratio:.3f}" in stdout
    else:
        assert f"stragglers: none above ×1.20; slowest rank {slowest} at ×{ratio:.3f}" in stdout


def test_demo_data_parallel(tmp_path: Path) -> None:
    steps = 14
    result, out, _ = _run_demo(tmp_path, "--steps", str(steps))
    stdout = result.stdout
    # One headline MFU (every step); the others say what they cover and how they relate to it.
    headline = re.search(
        rf"MFU (\d+\.\d)%  HFU \d+\.\d%  over all {2 * steps} rank-steps \(the run's MFU", stdout
    )
    assert headline is not None, stdout
    assert re.search(
        r"at the collector: MFU \d+\.\d%  HFU \d+\.\d% over each rank's last 20 steps \(its live "
        r"gauges: the end of the run, where the run's MFU above covers every step\)",
        stdout,
    )
    assert re.search(
        r"waterfall \(\d+ measured rank-steps\): MFU \d+\.\d% = .*\(these profiled steps' own "
        rf"MFU, instrumentation included; the run's is {headline.group(1)}%\)",
        stdout,
    )
    # The ranks share the machine's cached CPU peak: said once, for every rank.
    assert re.search(r"peak [\d.]+ GFLOP/s per rank \(measured\)", stdout), stdout
    assert stdout.count("GFLOP/s") == 1, stdout
    # Effective MFU beside the steps' MFU: from the agents' output and at the collector.
    assert re.search(
        r"\(the run's MFU; HFU adds recomputation\); effective MFU \d+\.\d% over every "
        r"rank-second",
        stdout,
    ), stdout
    assert re.search(r"job time: [\d.]+ rank-seconds: .*startup", stdout)
    assert re.search(r"effective MFU \d+\.\d% over every rank-second; ", stdout)
    assert f"report        {out / 'report' / 'report.html'}" in stdout
    assert "importing torch" in result.stdout  # progress while torch starts
    job = _check_outputs(out, steps, result.stdout + result.stderr)
    components = job["components"]
    assert isinstance(components, dict)
    assert components.get("recompute", 0) > 0  # activation checkpointing shows
    assert components.get("exposed_comm", 0) > 0  # DDP's all-reduces over dp
    _check_one_story(out, stdout)
    # A second run reuses its own output directory (and refuses anybody else's).
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "keep.txt").write_text("mine")
    refused = subprocess.run(_demo("--out", str(foreign)), capture_output=True, text=True,
                             timeout=60)  # fmt: skip
    assert refused.returncode == 2 and "was not made by mfuscope demo" in refused.stderr
    assert [p.name for p in foreign.iterdir()] == ["keep.txt"]


def test_demo_pipeline_shows_the_bubble(tmp_path: Path) -> None:
    steps = 10
    result, out, _ = _run_demo(tmp_path, "--steps", str(steps), "--pipeline")
    assert "2-stage pipeline (pp)" in result.stdout
    job = _check_outputs(out, steps, result.stdout + result.stderr)
    components = job["components"]
    assert isinstance(components, dict) and components.get("bubble_pipeline", 0) > 0
    assert re.search(r"step \(measured steps, mean over ranks\): .*bubble pipeline", result.stdout)


def test_ctrl_c_stops_everything(tmp_path: Path) -> None:
    env, marker = _demo_env(tmp_path)
    out = tmp_path / "out"
    demo = subprocess.Popen(
        _demo("--out", str(out), "--steps", "100000"),
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # like a shell job: our SIGINT reaches the demo alone
    )
    training = threading.Event()
    lines: list[str] = []

    def read() -> None:
        assert demo.stdout is not None
        for line in demo.stdout:
            lines.append(line)
            if "training ·" in line or "agent ready" in line:
                training.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        assert training.wait(TIMEOUT_S), "".join(lines)
        assert len(_marked_processes(marker)) >= 4  # demo, collector, torchrun, 2 workers
        demo.send_signal(signal.SIGINT)
        _, err = demo.communicate(timeout=60)
    finally:
        if demo.poll() is None:
            demo.kill()
            demo.communicate()  # reaped and its pipes closed: a failure here stays here
    assert demo.returncode == 130, err
    assert "interrupted: stopped training job, collector" in err
    _assert_nothing_left(marker, tmp_path)
    assert (out / "agent").is_dir()  # partial output is kept and named
