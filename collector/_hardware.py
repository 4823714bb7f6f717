"""Hardware counters of one job: restart-adjusted totals per rank, and the live ranks' gauges.

Agents send totals cumulative since their sampler started (`HardwareCounters`). As with the
agent-health counters (`_health`), a total lower than the rank's previous one comes from a
restarted agent: what the earlier process counted stays counted and the new totals add on top,
so the exported counters never fall while the job lives. A rank that never sent a counter has no
entry for it: the series is absent, never zero.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from mfuscope.core.hwcounters import HardwareCounters

__all__ = ["DeviceGauges", "HardwareLedger", "JobHardware"]

# Counter keys: ("link", link, direction), ("throttle", reason), ("energy",).
CounterKey = tuple[str, ...]


@dataclass(frozen=True)
class DeviceGauges:
    """Gauges over some live ranks: means of the ratios, sum of power (W)."""

    memory_busy_ratio: float | None = None
    sm_clock_ratio: float | None = None
    power_watts: float | None = None


@dataclass(frozen=True)
class JobHardware:
    """`counters`: ``(rank or None, key, value)``; rank None is the job total. `link_peaks`:
    ``(link, bytes/s)`` summed over live ranks. `gauges`: ``(rank or None, DeviceGauges)``."""

    counters: tuple[tuple[int | None, CounterKey, float], ...] = ()
    link_peaks: tuple[tuple[str, float], ...] = ()
    gauges: tuple[tuple[int | None, DeviceGauges], ...] = ()


def _counters(record: HardwareCounters) -> dict[CounterKey, float]:
    values: dict[CounterKey, float] = {
        ("link", x.link, x.direction): float(x.bytes_total) for x in record.links
    }
    values.update({("throttle", t.reason): t.seconds_total for t in record.throttle})
    if record.energy_joules_total is not None:
        values[("energy",)] = record.energy_joules_total
    return values


class _RankEntry:
    __slots__ = ("last", "latest", "offset")

    def __init__(self) -> None:
        self.offset: dict[CounterKey, float] = {}
        self.last: dict[CounterKey, float] = {}
        self.latest = HardwareCounters()

    def counts(self) -> dict[CounterKey, float]:
        keys = self.offset.keys() | self.last.keys()
        return {k: self.offset.get(k, 0.0) + self.last.get(k, 0.0) for k in keys}


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def _gauges(records: list[HardwareCounters]) -> DeviceGauges:
    busy = [r.memory_busy_ratio for r in records if r.memory_busy_ratio is not None]
    clock = [r.sm_clock_ratio for r in records if r.sm_clock_ratio is not None]
    power = [r.power_watts for r in records if r.power_watts is not None]
    return DeviceGauges(
        memory_busy_ratio=_mean(busy),
        sm_clock_ratio=_mean(clock),
        power_watts=sum(power) if power else None,
    )


class HardwareLedger:
    """Per rank of one job: restart-adjusted hardware counters and the latest record."""

    __slots__ = ("_entries",)

    def __init__(self) -> None:
        self._entries: dict[int, _RankEntry] = {}

    def update(self, rank: int, record: HardwareCounters) -> None:
        """Take `rank`'s latest record (its agent process's cumulative totals)."""
        entry = self._entries.get(rank)
        if entry is None:
            entry = self._entries[rank] = _RankEntry()
        values = _counters(record)
        if any(values.get(k, 0.0) < last for k, last in entry.last.items() if k in values):
            # A restarted agent: what the previous process counted stays counted.
            for key, last in entry.last.items():
                entry.offset[key] = entry.offset.get(key, 0.0) + last
            entry.last = {}
        entry.last.update(values)
        entry.latest = record

    def view(self, live_ranks: Iterable[int], *, per_rank: bool) -> JobHardware:
        """Job totals over every rank seen (expired ones included, so they never fall); gauges
        and link peaks over `live_ranks` only. With `per_rank`, one row per live rank."""
        live = sorted(r for r in set(live_ranks) if r in self._entries)
        counters: list[tuple[int | None, CounterKey, float]] = []
        if per_rank:
            # Like the per-rank step series, an expired rank's rows go with it.
            for rank in live:
                counts = self._entries[rank].counts()
                counters.extend((rank, k, v) for k, v in sorted(counts.items()))
            gauges: list[tuple[int | None, DeviceGauges]] = [
                (r, _gauges([self._entries[r].latest])) for r in live
            ]
        else:
            total: dict[CounterKey, float] = {}
            for entry in self._entries.values():
                for key, value in entry.counts().items():
                    total[key] = total.get(key, 0.0) + value
            counters.extend((None, k, v) for k, v in sorted(total.items()))
            gauges = [(None, _gauges([self._entries[r].latest for r in live]))] if live else []
        peaks: dict[str, float] = {}
        for rank in live:
            for peak in self._entries[rank].latest.link_peaks:
                peaks[peak.link] = peaks.get(peak.link, 0.0) + peak.bytes_per_s
        return JobHardware(
            counters=tuple(counters),
            link_peaks=tuple(sorted(peaks.items())),
            gauges=tuple(gauges),
        )
