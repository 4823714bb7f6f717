"""The calibrated CPU peak, measured once per machine and kept in a small JSON file.

Why: a CPU matmul rate moves with whatever else the machine runs. Measured afresh at every start,
runs on one machine, and the ranks of one run, would divide by different peaks, so a slower run
could show a higher MFU (figures: benchmarks/RESULTS.md#profiled-steps-and-cpu-timelines). A
cached figure holds still: every run on the machine, and every rank of a run, divides by the same
peak, and MFUs compare (docs/agent.md#cpu-peak).

**Key.** What the figure depends on (`CalibrationKey`): the CPU model, the CPUs this process may
run on (its affinity), torch's intra-op thread count, the dtype, and the method (matrix size,
rounds, duration and torch version). A change in any of them is another key, measured anew.

**File.** ``<dir>/cpu-peak.json`` with ``dir`` = the `cpu_peak_cache_dir` option, else
``$XDG_CACHE_HOME/mfuscope``, else ``~/.cache/mfuscope``; one entry per key, each with the peak,
its spread over the calibration's rounds, when and by which launch it was measured.

**Ranks agree.** The ranks of a job on one host start together. An exclusive ``flock`` on
``<dir>/cpu-peak.lock`` around read-measure-write lets the first rank measure while the others
wait (no two calibrations compete for the cores), then read its figure. With `recalibrate`, an
entry is measured again unless this launch (`incarnation`, the same on every rank) wrote it, so
the ranks of a recalibrating launch still share one figure. If the lock cannot be had in
`lock_timeout_s`, or the directory is not writable, the peak is measured without the cache.

No torch here: `mfuscope.agent.calibrate.cached_cpu_peak` supplies the measurement and the key.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import math
import os
import platform
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, TextIO

__all__ = [
    "CACHE_FILE",
    "Calibration",
    "CalibrationKey",
    "CpuPeak",
    "cpu_model",
    "cpu_peak",
    "default_cache_dir",
    "read_entries",
]

CACHE_FILE = "cpu-peak.json"
LOCK_FILE = "cpu-peak.lock"
SCHEMA = "mfuscope.cpu-peak"
VERSION = 1


@dataclass(frozen=True)
class CalibrationKey:
    """What a calibrated CPU peak depends on; `text` is its key in the cache file."""

    cpu_model: str
    cpus: int  # CPUs in this process's affinity mask
    threads: int  # torch's intra-op threads
    dtype: str
    method: str

    @property
    def text(self) -> str:
        return (
            f"{self.cpu_model} | cpus={self.cpus} | threads={self.threads} | {self.dtype} | "
            f"{self.method}"
        )


@dataclass(frozen=True)
class Calibration:
    """One measurement: the best rate (FLOP/s) over `rounds` rounds of `seconds` in all, and
    `spread_ratio`, (best round - worst round) / best round."""

    peak_flops: float
    spread_ratio: float
    rounds: int
    seconds: float


@dataclass(frozen=True)
class CpuPeak:
    """The peak a run uses, and where it came from: `cached` when read from `path` rather than
    measured by this call (`path` is None when the cache could not be used)."""

    key: CalibrationKey
    calibration: Calibration
    measured_unix_s: float
    incarnation: str
    cached: bool
    path: Path | None

    @property
    def peak_flops(self) -> float:
        return self.calibration.peak_flops

    def describe(self) -> str:
        """One phrase for logs, e.g. ``calibrated 2026-11-27 10:02 UTC, spread 2.1% over 5
        rounds, cached in /home/me/.cache/mfuscope/cpu-peak.json``."""
        when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(self.measured_unix_s))
        c = self.calibration
        what = f"calibrated {when}, spread {c.spread_ratio:.1%} over {c.rounds} rounds"
        if self.path is None:
            return f"{what}, not cached"
        return f"{what}, {'read from' if self.cached else 'cached in'} {self.path}"


def default_cache_dir(environ: Mapping[str, str] | None = None) -> Path:
    """``$XDG_CACHE_HOME/mfuscope``, else ``~/.cache/mfuscope``."""
    env = os.environ if environ is None else environ
    base = env.get("XDG_CACHE_HOME") or str(Path(env.get("HOME") or Path.home()) / ".cache")
    return Path(base) / "mfuscope"


def cpu_model(cpuinfo: str = "/proc/cpuinfo") -> str:
    """The CPU's model name (Linux ``/proc/cpuinfo``), else what `platform` says."""
    with contextlib.suppress(OSError), open(cpuinfo, encoding="utf-8", errors="replace") as stream:
        for line in stream:
            name, _, value = line.partition(":")
            if name.strip() in ("model name", "Model", "Hardware", "cpu model") and value.strip():
                return value.strip()
    return platform.processor() or platform.machine() or "unknown"


def affinity_cpus() -> int:
    """CPUs this process may run on (its affinity mask; the machine's count where there is none)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def read_entries(path: Path) -> dict[str, dict[str, Any]]:
    """The cache file's entries by key text; empty when the file is missing or not ours."""
    try:
        document = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    if not isinstance(document, dict) or document.get("schema") != SCHEMA:
        return {}
    entries = document.get("entries")
    if not isinstance(entries, dict):
        return {}
    return {k: v for k, v in entries.items() if isinstance(k, str) and isinstance(v, dict)}


def _entry_peak(key: CalibrationKey, entry: Mapping[str, Any], path: Path) -> CpuPeak | None:
    """The cached peak of an entry, or None if it is malformed."""
    try:
        calibration = Calibration(
            float(entry["peak_flops"]),
            float(entry["spread_ratio"]),
            int(entry["rounds"]),
            float(entry["seconds"]),
        )
        measured = float(entry["measured_unix_s"])
        incarnation = str(entry.get("incarnation", ""))
    except (KeyError, TypeError, ValueError):
        return None
    if not (math.isfinite(calibration.peak_flops) and calibration.peak_flops >= 1.0):
        return None
    return CpuPeak(key, calibration, measured, incarnation, cached=True, path=path)


def _write(path: Path, entries: Mapping[str, Mapping[str, Any]]) -> None:
    """Replace the cache file atomically (a reader never sees half a file)."""
    document = {"schema": SCHEMA, "version": VERSION, "entries": dict(entries)}
    fd, tmp = tempfile.mkstemp(prefix=".cpu-peak.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as stream:
            json.dump(document, stream, indent=2, sort_keys=True)
            stream.write("\n")
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


@contextlib.contextmanager
def _locked(
    lock_path: Path,
    timeout_s: float,
    monotonic: Callable[[], float],
    sleep: Callable[[float], None],
) -> Iterator[bool]:
    """Hold an exclusive flock on `lock_path` (yields True), or give up after `timeout_s`
    (yields False). The kernel drops the lock when its holder exits, however it exits."""
    stream: TextIO = open(lock_path, "a")  # noqa: SIM115 (held for the block)
    try:
        deadline = monotonic() + timeout_s
        while True:
            try:
                fcntl.flock(stream.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if monotonic() >= deadline:
                    yield False
                    return
                sleep(0.05)
        try:
            yield True
        finally:
            fcntl.flock(stream.fileno(), fcntl.LOCK_UN)
    finally:
        stream.close()


def cpu_peak(
    key: CalibrationKey,
    measure: Callable[[], Calibration],
    *,
    directory: Path,
    recalibrate: bool = False,
    incarnation: str = "",
    clock: Callable[[], float] = time.time,
    monotonic: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
    lock_timeout_s: float = 120.0,
) -> CpuPeak:
    """The cached peak for `key` in `directory`, else `measure()`'s, written for the next run.

    `recalibrate`: measure again unless this launch's `incarnation` wrote the entry (another rank
    of the launch already did). Raises only what `measure` raises.
    """
    path = directory / CACHE_FILE
    with contextlib.ExitStack() as stack:
        try:
            directory.mkdir(parents=True, exist_ok=True)
            held = stack.enter_context(
                _locked(directory / LOCK_FILE, lock_timeout_s, monotonic, sleep)
            )
        except OSError:  # no cache here (read-only home, ...): measure, keep nothing
            held = False
        if not held:
            return _measured(key, measure, clock, incarnation, path=None)
        entries = read_entries(path)
        entry = entries.get(key.text)
        found = None if entry is None else _entry_peak(key, entry, path)
        ours = bool(incarnation) and found is not None and found.incarnation == incarnation
        if found is not None and (not recalibrate or ours):
            return found
        fresh = _measured(key, measure, clock, incarnation, path=path)
        entries[key.text] = {
            **asdict(key),
            **asdict(fresh.calibration),
            "measured_unix_s": fresh.measured_unix_s,
            "incarnation": incarnation,
        }
        try:
            _write(path, entries)
        except OSError:
            return CpuPeak(key, fresh.calibration, fresh.measured_unix_s, incarnation, False, None)
        return fresh


def _measured(
    key: CalibrationKey,
    measure: Callable[[], Calibration],
    clock: Callable[[], float],
    incarnation: str,
    *,
    path: Path | None,
) -> CpuPeak:
    calibration = measure()
    return CpuPeak(key, calibration, clock(), incarnation, cached=False, path=path)
