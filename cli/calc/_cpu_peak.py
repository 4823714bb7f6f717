"""`mfuscope calc --device cpu` and `--calibrate`: this machine's calibrated CPU peak, the figure
the agent uses (docs/agent.md#cpu-peak), read from its cache or measured (and cached).

The one part of `calc` that measures rather than computes: it imports torch, through the agent's
calibration, and only when asked. `--calibrate` measures again every figure cached for this
machine (e.g. the one-thread figure of a torchrun job's ranks, alongside the shell's own thread
count), so the next run of any of them uses the new one.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mfuscope.core.hardware import PeakLookup, normalize_dtype

if TYPE_CHECKING:
    from mfuscope.agent.peak_cache import CpuPeak

__all__ = ["CpuPeaks", "cpu_peaks"]


@dataclass(frozen=True)
class CpuPeaks:
    """`lookup`: the peak for the asked dtype with torch's current thread count (source
    ``measured``); `peaks`: every figure this call measured or read, that one last."""

    lookup: PeakLookup
    peaks: tuple[CpuPeak, ...]

    def lines(self) -> list[str]:
        return [
            f"CPU peak ({p.key.dtype}, {p.key.threads} thread{'s' * (p.key.threads != 1)}): "
            f"{p.peak_flops / 1e9:.1f} GFLOP/s, {p.describe()}"
            for p in self.peaks
        ]

    def as_json(self) -> list[dict[str, Any]]:
        return [
            {
                "dtype": p.key.dtype,
                "threads": p.key.threads,
                "cpus": p.key.cpus,
                "cpu_model": p.key.cpu_model,
                "peak_flops": p.peak_flops,
                "spread_ratio": p.calibration.spread_ratio,
                "measured_unix_s": p.measured_unix_s,
                "cached": p.cached,
                "path": None if p.path is None else str(p.path),
            }
            for p in self.peaks
        ]


def cpu_peaks(dtype: str, *, calibrate: bool, cache_dir: Path | None = None) -> CpuPeaks:
    """The calibrated CPU peak for `dtype` (``tf32`` means fp32 on a CPU); with `calibrate`,
    every figure cached for this machine is measured again first. `cache_dir` None: where the
    agents keep it. Raises ValueError for a dtype the calibration does not know."""
    import torch
    from mfuscope.agent import calibrate as calibration
    from mfuscope.agent.config import AgentConfig
    from mfuscope.agent.peak_cache import CACHE_FILE, default_cache_dir, read_entries

    # The agents' cache: their `cpu_peak_cache_dir` (MFUSCOPE_CPU_PEAK_CACHE_DIR), else the default.
    configured = AgentConfig.option("cpu_peak_cache_dir", {})
    directory = cache_dir or (Path(configured) if configured else default_cache_dir())
    kind = normalize_dtype(dtype)
    key = calibration.calibration_key(kind)
    peaks: list[CpuPeak] = []
    if calibrate:
        threads = torch.get_num_threads()
        for entry in read_entries(directory / CACHE_FILE).values():
            same_machine = (entry.get("cpu_model"), entry.get("cpus"), entry.get("method")) == (
                key.cpu_model,
                key.cpus,
                key.method,
            )
            other = (entry.get("threads"), entry.get("dtype")) != (key.threads, key.dtype)
            if not (same_machine and other and isinstance(entry.get("threads"), int)):
                continue
            torch.set_num_threads(entry["threads"])
            try:
                peaks.append(
                    calibration.cached_cpu_peak(
                        str(entry["dtype"]), cache_dir=directory, recalibrate=True
                    )
                )
            finally:
                torch.set_num_threads(threads)
    current = calibration.cached_cpu_peak(kind, cache_dir=directory, recalibrate=calibrate)
    peaks.append(current)
    message = (
        f"CPU {current.key.dtype} matmul peak with {current.key.threads} thread(s), "
        f"{current.describe()} (a measurement, not a spec)"
    )
    return CpuPeaks(PeakLookup(current.peak_flops, "measured", "cpu", message), tuple(peaks))
