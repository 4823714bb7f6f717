"""What the agent says in the job's log: one start-up line on rank 0, one line per analysed
window, Kineto's per-window stderr lines silenced, and INFO lines visible without any logging
configuration (agent/_announce.py)."""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from mfuscope.agent._agent import Seams, agent_with_seams
from mfuscope.agent._announce import (
    KINETO_LOG_LEVEL,
    KINETO_QUIET_LEVEL,
    ensure_visible,
    quiet_kineto,
    window_line,
)
from mfuscope.core.schema import decode_batch

from tests.support.agent_fakes import Decomposition, Exposed, FakeProfiler, step_until


class _Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


def _window(step: int) -> Decomposition:
    return Decomposition(
        step=step,
        wall_s=1.0,
        compute_s=0.5,
        recompute_s=0.1,
        exposed_comm_s=0.2,
        bubble_idle_s=0.2,
        exposed_comm=(Exposed("dp", "intra_node", 0.2),),
    )


def test_one_startup_line_and_one_line_per_window(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(KINETO_LOG_LEVEL, raising=False)
    logger = logging.getLogger("mfuscope.test.announce")
    logger.setLevel(logging.DEBUG)
    lines = _Lines()
    logger.addHandler(lines)

    def analyse(path: str) -> Sequence[Any]:
        return [_window(2), _window(3)]

    agent = agent_with_seams(
        Seams(profiler_factory=FakeProfiler, analyse=analyse, timer=None, logger=logger),
        job="logged",
        jsonl_path=str(tmp_path / "out.jsonl"),
        peak_flops=2e12,
        profile=True,
        profile_first_step=2,
        profile_steps=2,
        flush_interval_s=60.0,
    )
    step_until(agent, lambda health: health.windows_analysed_total > 0)
    agent.close()
    messages = [r.getMessage() for r in lines.records if r.levelno == logging.INFO]
    (start,) = [m for m in messages if "agent started" in m]
    assert start == (
        f"mfuscope: agent started for job 'logged' on 1 rank (cpu); peak 2 TFLOP/s per device "
        f"given; reports to JSONL {tmp_path / 'out.jsonl'}; profiled windows of 2 steps from "
        "step 2, then every 1000 steps or 300 s, whichever comes first (at most 0.50% of the "
        "time); the steps between windows carry the latest window's breakdown"
    )
    (window,) = [m for m in messages if "profiled window, steps" in m]
    assert window == (
        "mfuscope: profiled window, steps 2-3, analysed: compute 50.0%, recompute 10.0%, "
        "bubble idle 20.0%, exposed comm 20.0% (dp/intra_node 20.0%); later steps carry this "
        "breakdown until the next window"
    )
    # Kineto's USDT lines are silenced for the windows to come, unless the user chose a level.
    assert os.environ[KINETO_LOG_LEVEL] == KINETO_QUIET_LEVEL


def test_a_users_kineto_level_is_kept() -> None:
    env = {KINETO_LOG_LEVEL: "2"}
    assert quiet_kineto(env) is False and env[KINETO_LOG_LEVEL] == "2"
    empty: dict[str, str] = {}
    assert quiet_kineto(empty) is True and empty == {KINETO_LOG_LEVEL: KINETO_QUIET_LEVEL}


def test_a_window_without_a_breakdown_says_nothing() -> None:
    assert window_line([4, 5], []) is None


def test_info_lines_show_without_logging_configured_then_follow_the_root(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    root = logging.getLogger()
    monkeypatch.setattr(root, "handlers", [])  # an application that configured no logging
    logger = logging.getLogger("mfuscope.test.unconfigured")
    ensure_visible(logger)
    logger.info("mfuscope: agent started (unconfigured)")
    assert "mfuscope: agent started (unconfigured)" in capsys.readouterr().err
    # Once the application configures logging, the root's handlers and level decide.
    configured = _Lines()
    monkeypatch.setattr(root, "handlers", [configured])
    monkeypatch.setattr(root, "level", logging.WARNING)
    logger.info("not shown: below the root's level")
    logger.warning("shown by the application's handler")
    assert [r.getMessage() for r in configured.records] == ["shown by the application's handler"]
    assert capsys.readouterr().err == ""
    # A logger the application configured itself is left alone.
    mine = logging.getLogger("mfuscope.test.configured")
    mine.setLevel(logging.ERROR)
    ensure_visible(mine)
    assert mine.handlers == [] and mine.propagate


def test_a_calibrated_peak_is_cached_and_said_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Two runs on one machine: the first calibrates and caches, the second reads the same figure;
    # `recalibrate_cpu_peak` measures again. Each start-up line says which.
    from mfuscope.agent import calibrate

    rates = iter([90e9, 110e9])
    monkeypatch.setattr(
        calibrate,
        "calibrate_cpu_peak",
        lambda *a, **k: calibrate.Calibration(next(rates), 0.03, 5, 2.0),
    )
    logger = logging.getLogger("mfuscope.test.cached-peak")
    logger.setLevel(logging.INFO)
    lines = _Lines()
    logger.addHandler(lines)
    peaks = []
    for run, options in enumerate([{}, {}, {"recalibrate_cpu_peak": True}]):
        agent = agent_with_seams(
            Seams(timer=None, logger=logger),
            job="cached",
            jsonl_path=str(tmp_path / f"out{run}.jsonl"),
            cpu_peak_cache_dir=str(tmp_path / "cache"),
            profile=False,
            flush_interval_s=60.0,
            **options,
        )
        with agent.step():
            pass
        agent.close()
        peaks.append(decode_batch((tmp_path / f"out{run}.jsonl").read_text().splitlines()[0]))
    assert [(b.peak_flops, b.peak_source) for b in peaks] == [
        (90e9, "measured"),
        (90e9, "measured"),
        (110e9, "measured"),
    ]
    starts = [r.getMessage() for r in lines.records if "agent started" in r.getMessage()]
    cache = tmp_path / "cache" / "cpu-peak.json"
    assert (
        "peak 90 GFLOP/s per device measured by a CPU matmul calibration (calibrated" in starts[0]
    )
    assert f"spread 3.0% over 5 rounds, cached in {cache}" in starts[0]
    assert f"read from {cache}" in starts[1]
    assert "peak 110 GFLOP/s" in starts[2] and f"cached in {cache}" in starts[2]
