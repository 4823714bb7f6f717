"""The cached CPU peak: measured once per key, read back after, re-measured on request (once per
launch) or when the key changes; ranks that start together share one figure. Scripted
calibrations in a temporary cache directory (no torch, no wall clock)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import threading
from dataclasses import replace
from pathlib import Path

import pytest
from mfuscope.agent.peak_cache import (
    CACHE_FILE,
    Calibration,
    CalibrationKey,
    cpu_model,
    cpu_peak,
    default_cache_dir,
    read_entries,
)

KEY = CalibrationKey(cpu_model="Test CPU 9000", cpus=2, threads=1, dtype="fp32", method="v1 test")


class Script:
    """A calibration that returns the next of `peaks` (FLOP/s) and counts its calls."""

    def __init__(self, *peaks: float) -> None:
        self.peaks = list(peaks)
        self.calls = 0

    def __call__(self) -> Calibration:
        peak = self.peaks[self.calls]
        self.calls += 1
        return Calibration(peak, 0.02, 5, 2.0)


class Clock:
    def __init__(self, now: float = 1_800_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def test_measured_once_then_read_from_the_cache(tmp_path: Path) -> None:
    measure = Script(100e9, 80e9)
    first = cpu_peak(KEY, measure, directory=tmp_path, clock=Clock())
    again = cpu_peak(KEY, measure, directory=tmp_path, clock=Clock(1_900_000_000.0))
    assert measure.calls == 1
    assert (first.cached, again.cached) == (False, True)
    assert again.peak_flops == first.peak_flops == 100e9
    assert again.calibration == Calibration(100e9, 0.02, 5, 2.0)  # the spread is kept too
    assert again.measured_unix_s == 1_800_000_000.0
    assert again.path == tmp_path / CACHE_FILE
    assert "read from" in again.describe() and "cached in" in first.describe()
    entry = read_entries(tmp_path / CACHE_FILE)[KEY.text]
    assert entry["cpu_model"] == "Test CPU 9000" and entry["spread_ratio"] == 0.02


@pytest.mark.parametrize(
    "change",
    [
        {"cpu_model": "Other CPU"},
        {"cpus": 4},
        {"threads": 2},
        {"dtype": "bf16"},
        {"method": "v2 test"},
    ],
)
def test_a_changed_key_is_measured_anew_and_both_are_kept(
    tmp_path: Path, change: dict[str, object]
) -> None:
    measure = Script(100e9, 50e9)
    cpu_peak(KEY, measure, directory=tmp_path)
    other = replace(KEY, **change)  # type: ignore[arg-type]
    found = cpu_peak(other, measure, directory=tmp_path)
    assert (measure.calls, found.cached, found.peak_flops) == (2, False, 50e9)
    assert cpu_peak(KEY, measure, directory=tmp_path).peak_flops == 100e9
    assert set(read_entries(tmp_path / CACHE_FILE)) == {KEY.text, other.text}


def test_recalibration_happens_once_per_launch(tmp_path: Path) -> None:
    measure = Script(100e9, 90e9, 95e9)
    cpu_peak(KEY, measure, directory=tmp_path, incarnation="launch-1")
    # Launch 2 asks to recalibrate: its first rank measures, its second reads that figure.
    first = cpu_peak(KEY, measure, directory=tmp_path, recalibrate=True, incarnation="launch-2")
    second = cpu_peak(KEY, measure, directory=tmp_path, recalibrate=True, incarnation="launch-2")
    assert (first.cached, second.cached) == (False, True)
    assert first.peak_flops == second.peak_flops == 90e9
    # Later launches without the request use it; a new request measures again.
    assert cpu_peak(KEY, measure, directory=tmp_path, incarnation="launch-3").peak_flops == 90e9
    assert cpu_peak(KEY, measure, directory=tmp_path, recalibrate=True).peak_flops == 95e9
    assert measure.calls == 3


@pytest.mark.parametrize(
    "content",
    [
        "not json",
        '{"schema": "someone else", "entries": {}}',
        json.dumps({"schema": "mfuscope.cpu-peak", "entries": {KEY.text: {"peak_flops": "x"}}}),
        json.dumps({"schema": "mfuscope.cpu-peak", "entries": {KEY.text: {"peak_flops": 0.5}}}),
    ],
)
def test_a_broken_cache_is_measured_over(tmp_path: Path, content: str) -> None:
    (tmp_path / CACHE_FILE).write_text(content)
    measure = Script(100e9)
    found = cpu_peak(KEY, measure, directory=tmp_path)
    assert (found.cached, found.peak_flops, measure.calls) == (False, 100e9, 1)
    assert cpu_peak(KEY, measure, directory=tmp_path).cached


def test_an_unusable_directory_measures_without_caching(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("a file where the cache directory should be")
    measure = Script(100e9, 90e9)
    found = cpu_peak(KEY, measure, directory=blocker / "mfuscope")
    assert (found.cached, found.path, found.peak_flops) == (False, None, 100e9)
    assert "not cached" in found.describe()


def test_ranks_starting_together_share_one_calibration(tmp_path: Path) -> None:
    # Rank A holds the lock while it measures; rank B waits for it, then reads A's figure.
    measuring, go, waiting = threading.Event(), threading.Event(), threading.Event()

    def slow_measure() -> Calibration:
        measuring.set()
        assert go.wait(timeout=30)
        return Calibration(100e9, 0.01, 5, 2.0)

    def wait_for_go(_seconds: float) -> None:
        waiting.set()
        go.wait(timeout=30)

    never = Script()  # B must not measure
    results: dict[str, object] = {}
    a = threading.Thread(
        target=lambda: results.update(a=cpu_peak(KEY, slow_measure, directory=tmp_path))
    )
    a.start()
    assert measuring.wait(timeout=30)
    b = threading.Thread(
        target=lambda: results.update(b=cpu_peak(KEY, never, directory=tmp_path, sleep=wait_for_go))
    )
    b.start()
    assert waiting.wait(timeout=30)  # B found the lock taken
    go.set()
    a.join(timeout=30)
    b.join(timeout=30)
    got_a, got_b = results["a"], results["b"]
    assert got_a.peak_flops == got_b.peak_flops == 100e9  # type: ignore[attr-defined]
    assert (got_a.cached, got_b.cached, never.calls) == (False, True, 0)  # type: ignore[attr-defined]


def test_a_lock_never_released_times_out_to_a_plain_measurement(tmp_path: Path) -> None:
    import fcntl

    tmp_path.mkdir(exist_ok=True)
    with open(tmp_path / "cpu-peak.lock", "a") as held:
        fcntl.flock(held.fileno(), fcntl.LOCK_EX)
        now = [0.0]

        def sleep(seconds: float) -> None:
            now[0] += seconds

        found = cpu_peak(
            KEY,
            Script(70e9),
            directory=tmp_path,
            monotonic=lambda: now[0],
            sleep=sleep,
            lock_timeout_s=1.0,
        )
    assert (found.cached, found.path, found.peak_flops) == (False, None, 70e9)
    assert now[0] >= 1.0
    assert not (tmp_path / CACHE_FILE).exists()


@pytest.mark.slow
def test_two_processes_agree(tmp_path: Path) -> None:
    # Two real processes (as two ranks) calibrate at once: one measures, both report its figure.
    code = textwrap.dedent(
        """
        import os, sys, time
        from pathlib import Path
        from mfuscope.agent.peak_cache import Calibration, CalibrationKey, cpu_peak
        key = CalibrationKey("Test CPU", 2, 1, "fp32", "v1 test")
        def measure():
            time.sleep(0.5)  # long enough for the other process to reach the lock
            return Calibration(float(os.getpid()), 0.0, 1, 0.5)
        found = cpu_peak(key, measure, directory=Path(sys.argv[1]))
        print(found.peak_flops, found.cached)
        """
    )
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", code, str(tmp_path)], stdout=subprocess.PIPE, text=True
        )
        for _ in range(2)
    ]
    outputs = [p.communicate(timeout=60)[0].split() for p in procs]
    assert all(p.returncode == 0 for p in procs)
    assert outputs[0][0] == outputs[1][0]
    assert sorted(o[1] for o in outputs) == ["False", "True"]


def test_default_cache_dir_follows_xdg() -> None:
    assert default_cache_dir({"XDG_CACHE_HOME": "/x/cache", "HOME": "/h"}) == Path(
        "/x/cache/mfuscope"
    )
    assert default_cache_dir({"HOME": "/h"}) == Path("/h/.cache/mfuscope")


def test_cpu_model_from_cpuinfo(tmp_path: Path) -> None:
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nvendor_id\t: AuthenticAMD\nmodel name\t: AMD EPYC 9654\n")
    assert cpu_model(str(info)) == "AMD EPYC 9654"
    assert cpu_model(str(tmp_path / "missing"))  # falls back to what platform says
