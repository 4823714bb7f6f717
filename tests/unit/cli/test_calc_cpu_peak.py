"""`mfuscope calc --device cpu` / `--calibrate`: this machine's cached CPU peak, the agent's figure,
and a recalibration that re-measures every figure cached for the machine (scripted calibration,
temporary cache directory)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from mfuscope.agent import calibrate
from mfuscope.agent.peak_cache import CACHE_FILE, read_entries
from mfuscope.cli import main


@pytest.fixture
def rates(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> list[float]:
    """Scripted calibrations, popped in order (FLOP/s), into the agents' cache directory, set to
    `tmp_path/mfuscope` (as `cpu_peak_cache_dir` / MFUSCOPE_CPU_PEAK_CACHE_DIR)."""
    monkeypatch.setenv("MFUSCOPE_CPU_PEAK_CACHE_DIR", str(tmp_path / "mfuscope"))
    script = [100e9, 40e9, 120e9, 50e9]

    def scripted(dtype: str, *args: object, **kwargs: object) -> calibrate.Calibration:
        return calibrate.Calibration(script.pop(0), 0.04, 5, 2.0)

    monkeypatch.setattr(calibrate, "calibrate_cpu_peak", scripted)
    return script


def test_device_cpu_uses_the_cached_peak(
    rates: list[float], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    work = "--params 1G --tokens-per-step 1000 --step-time 1 --device cpu"
    assert main(["calc", *work.split(), "--json"]) == 0
    first = json.loads(capsys.readouterr().out)
    assert (first["peak_flops"], first["peak_source"]) == (100e9, "measured")
    assert first["mfu"] == pytest.approx(6e12 / 100e9)  # 6 N tokens / (peak x 1 s)
    assert first["cpu_peaks"][0]["dtype"] == "fp32" and not first["cpu_peaks"][0]["cached"]
    assert main(["calc", *work.split()]) == 0  # the same figure, read back
    text = capsys.readouterr().out
    assert "GFLOP/s" in text and f"read from {tmp_path / 'mfuscope' / CACHE_FILE}" in text
    assert rates == [40e9, 120e9, 50e9]


def test_calibrate_measures_every_cached_figure_again(
    rates: list[float], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # A torchrun job's ranks (one thread each) cached their figure; the shell has its own.
    ranks_key = calibrate.calibration_key("fp32", threads=1)
    shell_key = calibrate.calibration_key("fp32")
    calibrate.cpu_peak(  # what the ranks' agents left in the cache
        ranks_key,
        lambda: calibrate.Calibration(rates.pop(0), 0.04, 5, 2.0),
        directory=tmp_path / "mfuscope",
    )
    assert main(["calc", "--calibrate"]) == 0
    lines = capsys.readouterr().out.splitlines()
    entries = read_entries(tmp_path / "mfuscope" / CACHE_FILE)
    if ranks_key == shell_key:  # a one-core machine: one figure
        assert len(lines) == 1 and entries[shell_key.text]["peak_flops"] == 40e9
        return
    assert [line.split(":")[0] for line in lines] == [
        "CPU peak (fp32, 1 thread)",
        f"CPU peak (fp32, {shell_key.threads} threads)",
    ]
    assert entries[ranks_key.text]["peak_flops"] == 40e9  # re-measured (was 100)
    assert entries[shell_key.text]["peak_flops"] == 120e9


def test_a_dtype_the_calibration_lacks_is_an_error(
    rates: list[float], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["calc", "--calibrate", "--dtype", "fp8"]) == 2
    assert "no CPU matmul calibration for 'fp8'" in capsys.readouterr().err
