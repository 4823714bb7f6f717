"""The hardware-counter sampler: about once a second, on the agent's periodic thread.

Each rank samples its own GPU (NVML) so the device series line up with the rank's MFU and a
throttled GPU is named by its rank; the node's NICs (sysfs) are shared by the ranks of a node, so
each is sampled by one rank of its node (`node_identity.Placement.nic_readers`) and node traffic
is counted once (docs/agent.md). The sampler turns
raw reads into totals since it started (wrap-around handled in `counter_delta`) and keeps the
latest gauges; `snapshot()` hands the transport thread a `HardwareCounters` record for the batch.

Clock-throttle seconds are sampled: a reason active at a sample counts as active for the whole
interval since the previous sample, so totals are exact to one sampling interval per episode.
Telemetry never raises into training: a failing read is skipped, logged at most once per interval.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Collection
from typing import Any

from mfuscope.agent._health import RateLimitedLog
from mfuscope.agent._hw_readers import (
    THROTTLE_REASON_BITS,
    CounterRead,
    NicReader,
    NvmlReader,
    NvmlReading,
)
from mfuscope.agent._periodic import Periodic, Task
from mfuscope.agent.gpu_identity import GpuRef
from mfuscope.core.hwcounters import (
    HardwareCounters,
    LinkBytes,
    LinkPeak,
    ThrottleTime,
    counter_delta,
)

__all__ = ["HardwareSampler", "build_hardware_sampler"]

DEFAULT_INTERVAL_S = 1.0
_SATURATED_32 = (1 << 32) - 1


class _Totals:
    """Cumulative byte totals from successive raw counter reads, keyed by any hashable key."""

    def __init__(self) -> None:
        self.previous: dict[Any, CounterRead] = {}
        self.bytes: dict[Any, int] = {}

    def update(self, key: Any, read: CounterRead) -> bool:
        """Take one read; returns True when a 32-bit counter sits at its maximum (saturated)."""
        before = self.previous.get(key)
        self.previous[key] = read
        self.bytes.setdefault(key, 0)
        if before is not None:
            delta = counter_delta(before.value, read.value, before.width_bits)
            self.bytes[key] += delta * read.unit_bytes
        return read.width_bits == 32 and read.value == _SATURATED_32


class HardwareSampler:
    """Samples `nvml` (an `NvmlReader` or None) and `nics` (a `NicReader` or None).

    `clock` is monotonic seconds (injected so tests step time by hand). `sample()` does one tick
    and is what the periodic thread calls every `interval_s`; tests call it directly.
    """

    def __init__(
        self,
        nvml: NvmlReader | None,
        nics: NicReader | None,
        *,
        log: RateLimitedLog,
        link_peaks: tuple[LinkPeak, ...] = (),
        clock: Callable[[], float] = time.monotonic,
        interval_s: float = DEFAULT_INTERVAL_S,
    ) -> None:
        self._nvml = nvml
        self._nics = nics
        self._log = log
        self._clock = clock
        self._interval_s = interval_s
        self._link_peaks = link_peaks
        self._lock = threading.Lock()
        self._links = _Totals()  # key: (link, direction, port)
        self._pcie_estimate: dict[str, float] = {}  # direction -> bytes from throughput samples
        self._energy_mj: int | None = None  # the latest raw read
        self._energy_total_mj = 0
        self._throttle: dict[str, float] | None = None
        self._last_sample_s: float | None = None
        self._latest = NvmlReading()
        self._periodic: Periodic | None = None
        self._task: Task | None = None
        self.failures = 0

    # --- one tick -------------------------------------------------------------------------------

    def sample(self) -> None:
        """Read every counter once. Never raises."""
        try:
            self._sample()
        except Exception as exc:
            self.failures += 1
            self._log.warning("hw-sample", "mfuscope: hardware counter sample failed: %r", exc)

    def _sample(self) -> None:
        now = self._clock()
        reading = self._nvml.read() if self._nvml is not None else None
        nic_reads = self._nics.read() if self._nics is not None else {}
        with self._lock:
            elapsed = None if self._last_sample_s is None else max(now - self._last_sample_s, 0.0)
            self._last_sample_s = now
            if reading is not None:
                self._take_nvml(reading, elapsed)
            for key, read in nic_reads.items():
                if self._links.update(key, read):
                    self._log.warning(
                        f"hw-saturated-{key[2]}",
                        "mfuscope: %s counter of %s is saturated at 2^32-1 (a 32-bit port "
                        "counter); its bytes are no longer counted",
                        key[1],
                        key[2],
                    )

    def _take_nvml(self, reading: NvmlReading, elapsed: float | None) -> None:
        self._latest = reading
        for (link, direction), read in reading.counters:
            self._links.update((link, direction, "gpu"), read)
        for direction, rate in reading.pcie_rates_bytes_per_s:
            self._pcie_estimate.setdefault(direction, 0.0)
            if elapsed is not None:
                self._pcie_estimate[direction] += rate * elapsed
        if reading.energy_mj is not None:
            if self._energy_mj is not None:
                # 64-bit millijoules since the driver loaded: a decrease is a driver reload.
                self._energy_total_mj += counter_delta(self._energy_mj, reading.energy_mj, None)
            self._energy_mj = reading.energy_mj
        if reading.throttle_mask is not None:
            if self._throttle is None:
                self._throttle = dict.fromkeys(THROTTLE_REASON_BITS, 0.0)
            if elapsed is not None:
                for reason, bit in THROTTLE_REASON_BITS.items():
                    if reading.throttle_mask & bit:
                        self._throttle[reason] += elapsed

    # --- the record ----------------------------------------------------------------------------

    def snapshot(self) -> HardwareCounters | None:
        """The counters for the next batch; None before the first sample or with nothing read."""
        with self._lock:
            if self._last_sample_s is None:
                return None
            per_link: dict[tuple[str, str], int] = {}
            for (link, direction, _port), total in self._links.bytes.items():
                per_link[(link, direction)] = per_link.get((link, direction), 0) + total
            for direction, estimate in self._pcie_estimate.items():
                per_link.setdefault(("pcie", direction), round(estimate))
            latest = self._latest
            links = tuple(LinkBytes(k[0], k[1], v) for k, v in sorted(per_link.items()))
            seen = {link.link for link in links}
            record = HardwareCounters(
                memory_busy_ratio=latest.memory_busy_ratio,
                sm_clock_ratio=latest.sm_clock_ratio,
                power_watts=latest.power_watts,
                energy_joules_total=None
                if self._energy_mj is None
                else self._energy_total_mj / 1000.0,
                links=links,
                link_peaks=tuple(p for p in self._link_peaks if p.link in seen),
                throttle=tuple(
                    ThrottleTime(reason, seconds)
                    for reason, seconds in sorted((self._throttle or {}).items())
                ),
            )
        return None if record == HardwareCounters() else record

    # --- the thread ----------------------------------------------------------------------------

    def start(self, periodic: Periodic) -> None:
        """Sample (unless done already), then every `interval_s` on `periodic`'s thread (the
        agent's; its owner stops it)."""
        if self._last_sample_s is None:
            self.sample()
        self._periodic = periodic
        self._task = self._periodic.add("hwcounters", self._tick, delay_s=self._interval_s)

    def _tick(self) -> float:
        self.sample()
        return self._interval_s

    def stop(self, timeout_s: float = 1.0) -> None:
        """Stop sampling and release NVML. Idempotent; never raises."""
        if self._periodic is not None and self._task is not None:
            self._periodic.remove(self._task, timeout_s)
        if self._nvml is not None:
            self._nvml.close()


def build_hardware_sampler(
    *,
    gpu: GpuRef | None,
    sample_nics: bool | Collection[str],
    log: RateLimitedLog,
    link_peaks: tuple[LinkPeak, ...] = (),
    nvml: Any = None,
    sysfs_root: str = "/",
    clock: Callable[[], float] = time.monotonic,
    interval_s: float = DEFAULT_INTERVAL_S,
) -> HardwareSampler:
    """A sampler for the rank's GPU `gpu` (None: no GPU) and the node's NICs it samples
    (`sample_nics`: True all, False none, else the device names of the NICs to read).

    The NVML device is found from the GPU's UUID / PCI bus id, never from its CUDA index while
    CUDA_VISIBLE_DEVICES is set (`gpu_identity.nvml_handle`, docs/agent.md#gpu-identity).
    `nvml` defaults to the ``pynvml`` module; without a driver the GPU counters are absent.
    """
    reader: NvmlReader | None = None
    if gpu is not None:
        try:
            if nvml is None:
                import pynvml

                nvml = pynvml
            reader = NvmlReader(nvml, gpu)
            if reader.found_by == "index":
                log.info(
                    "hw-nvml-index",
                    "mfuscope: NVML device taken by CUDA index %s (CUDA_VISIBLE_DEVICES unset, "
                    "no UUID or PCI bus id matched)",
                    gpu.cuda_index,
                )
        except Exception as exc:
            log.info("hw-nvml", "mfuscope: no GPU hardware counters (NVML: %r)", exc)
    nics = None
    if sample_nics:
        nics = NicReader(sysfs_root, None if sample_nics is True else sample_nics)
    sampler = HardwareSampler(
        reader, nics, log=log, link_peaks=link_peaks, clock=clock, interval_s=interval_s
    )
    if reader is not None:
        sampler.sample()  # the first read decides which counters this GPU supports
        for reason in reader.first_reasons:
            log.info(f"hw-{reason[:40]}", "mfuscope: hardware counter unavailable: %s", reason)
    return sampler
