"""The hardware-counter part of the metric contract (docs/reference/metrics.md).

Counters: ``mfuscope_link_bytes_total{link, direction}``, bytes moved per link kind (NVLink and PCIe
of the ranks' GPUs; InfiniBand, RoCE and Ethernet of the nodes, counted once per node);
``mfuscope_device_clock_throttle_seconds_total{reason}``, summed over the ranks' GPUs (so its rate
divided by the number of GPUs is the fraction of time throttled); and
``mfuscope_device_energy_joules_total``. Gauges from each live rank's latest sample: memory busy and
SM clock ratios (means over the ranks), board power (sum), and the links' spec rate (sum), to plot
a tier's bytes/s against. A counter no rank can read is an absent series, never a zero.
"""

from __future__ import annotations

from mfuscope.collector._snapshot import JobSnapshot
from mfuscope.exporters.model import MetricFamily, Sample

__all__ = ["device_families"]

_GAUGES: tuple[tuple[str, str, str, str], ...] = (
    (
        "mfuscope_device_memory_busy_ratio",
        "memory_busy_ratio",
        "1",
        "fraction of time device memory (HBM) was read or written, latest sample (mean over ranks)",
    ),
    (
        "mfuscope_device_sm_clock_ratio",
        "sm_clock_ratio",
        "1",
        "SM clock / maximum SM clock, latest sample (mean over ranks)",
    ),
    (
        "mfuscope_device_power_watts",
        "power_watts",
        "W",
        "board power draw of the ranks' GPUs, latest sample (summed), watts",
    ),
)


def _who(job: str, rank: int | None) -> tuple[str, ...]:
    return (job,) if rank is None else (job, str(rank))


def device_families(jobs: tuple[JobSnapshot, ...], *, per_rank: bool) -> list[MetricFamily]:
    """The hardware-counter families of `jobs`, in a fixed order."""
    who = ("job", "rank") if per_rank else ("job",)
    links: list[Sample] = []
    throttle: list[Sample] = []
    energy: list[Sample] = []
    for j in jobs:
        for rank, key, value in j.hardware.counters:
            labels = _who(j.job, rank)
            if key[0] == "link":
                links.append(Sample((*labels, key[1], key[2]), value, j.start_unix_ns))
            elif key[0] == "throttle":
                throttle.append(Sample((*labels, key[1]), value, j.start_unix_ns))
            else:
                energy.append(Sample(labels, value, j.start_unix_ns))
    families = [
        MetricFamily(
            name="mfuscope_link_bytes_total",
            kind="counter",
            help="bytes moved per link kind (nvlink, pcie: the ranks' GPUs; ib, roce, ethernet: "
            "the nodes' NICs, once per node) and direction, from hardware counters",
            unit="By",
            label_names=(*who, "link", "direction"),
            samples=tuple(links),
        ),
        MetricFamily(
            name="mfuscope_device_clock_throttle_seconds_total",
            kind="counter",
            help="seconds the ranks' GPUs ran with the SM clock held down, per NVML clock-event "
            "reason (summed over GPUs; sampled about once a second)",
            unit="s",
            label_names=(*who, "reason"),
            samples=tuple(throttle),
        ),
        MetricFamily(
            name="mfuscope_device_energy_joules_total",
            kind="counter",
            help="energy the ranks' GPUs used while their agents ran, joules",
            unit="J",
            label_names=who,
            samples=tuple(energy),
        ),
    ]
    for name, attr, unit, help_text in _GAUGES:
        samples = []
        for j in jobs:
            for rank, gauges in j.hardware.gauges:
                value = getattr(gauges, attr)
                if value is not None:
                    samples.append(Sample(_who(j.job, rank), float(value)))
        families.append(
            MetricFamily(
                name=name,
                kind="gauge",
                help=help_text,
                unit=unit,
                label_names=who,
                samples=tuple(samples),
            )
        )
    families.append(
        MetricFamily(
            name="mfuscope_link_peak_bandwidth_bytes_per_second",
            kind="gauge",
            help="spec unidirectional rate of the links the hardware counters cover (summed over "
            "the live ranks' GPUs, and over the nodes' NIC ports), bytes/s",
            unit="By/s",
            label_names=("job", "link"),
            samples=tuple(
                Sample((j.job, link), rate) for j in jobs for link, rate in j.hardware.link_peaks
            ),
        )
    )
    return families
