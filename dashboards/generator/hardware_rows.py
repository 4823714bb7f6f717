"""Job dashboard rows for the hardware counters, one per tier: HBM and clocks, NVLink, PCIe, NICs.

Bytes/s are the rates of `mfuscope_link_bytes_total` (summed over the job's GPUs, or once per node
for the NICs), drawn against `mfuscope_link_peak_bandwidth_bytes_per_second` summed the same way,
so a tier's traffic and its spec share one axis. A tier whose counters no rank can read has no
series: its panel shows "No data", never a flat zero.
"""

from __future__ import annotations

from _common import AMBER, GREEN, JOB, RED, Query, Row, Threshold, timeseries_panel

__all__ = ["THROTTLE_BANDS", "hardware_rows"]

# Must match MFUScopeClockThrottled (0.2 of GPU time for one reason).
THROTTLE_BANDS: list[Threshold] = [(None, GREEN), (0.1, AMBER), (0.2, RED)]
_RATE = "$__rate_interval"


def _link_row(title: str, links: str, what: str) -> Row:
    """One tier: `links` is a regex of `link` label values (several NIC kinds share a row)."""
    chosen = f'{JOB}, link=~"{links}"'
    return Row(
        title,
        [
            timeseries_panel(
                f"{title}: bytes/s against the spec",
                f"{what} Transmit and receive rates from hardware counters (sampled about once "
                "a second by each agent), against the links' spec unidirectional rate (dashed). "
                "Traffic at the spec while collectives are exposed: the tier is saturated; far "
                "below it while collectives are slow: look at the fabric.",
                "Bps",
                [
                    Query(
                        f"sum by (link) (rate(mfuscope_link_bytes_total"
                        f'{{{chosen}, direction="tx"}}[{_RATE}]))',
                        "transmit {{link}}",
                    ),
                    Query(
                        f"sum by (link) (rate(mfuscope_link_bytes_total"
                        f'{{{chosen}, direction="rx"}}[{_RATE}]))',
                        "receive {{link}}",
                    ),
                    Query(
                        "sum by (link) "
                        f"(mfuscope_link_peak_bandwidth_bytes_per_second{{{chosen}}})",
                        "spec {{link}} (unidirectional)",
                    ),
                ],
                min_value=0,
                dashed_series_regex="spec.*",
                width=24,
            )
        ],
    )


def _device_row() -> Row:
    return Row(
        "Hardware: HBM and clocks",
        [
            timeseries_panel(
                "HBM busy",
                "Fraction of time the GPUs' device memory (HBM) was being read or written (NVML "
                "memory utilisation, mean over the job's GPUs). Near 1 with low MFU: the "
                "kernels are memory-bound.",
                "percentunit",
                [Query(f"avg(mfuscope_device_memory_busy_ratio{{{JOB}}})", "HBM busy")],
                min_value=0,
                max_value=1,
                width=8,
            ),
            timeseries_panel(
                "SM clock and throttling",
                "SM clock / its maximum (mean over GPUs), and per NVML reason the fraction of "
                "GPU time the clock was held down (throttled GPU-seconds per second / GPUs). A "
                "throttled clock lowers MFU with no change in the step timeline "
                "(MFUScopeClockThrottled).",
                "percentunit",
                [
                    Query(f"avg(mfuscope_device_sm_clock_ratio{{{JOB}}})", "SM clock / max"),
                    Query(
                        "sum by (reason) (rate(mfuscope_device_clock_throttle_seconds_total"
                        f"{{{JOB}}}[{_RATE}])) / scalar(sum(mfuscope_ranks{{{JOB}}}))",
                        "throttled: {{reason}}",
                    ),
                ],
                thresholds=THROTTLE_BANDS,
                min_value=0,
                max_value=1,
                width=8,
            ),
            timeseries_panel(
                "GPU power",
                "Board power draw summed over the job's GPUs (latest sample), and the energy "
                "rate from the energy counter (the same quantity, averaged over the interval).",
                "watt",
                [
                    Query(f"sum(mfuscope_device_power_watts{{{JOB}}})", "power (latest)"),
                    Query(
                        f"sum(rate(mfuscope_device_energy_joules_total{{{JOB}}}[{_RATE}]))",
                        "energy rate",
                    ),
                ],
                min_value=0,
                width=8,
            ),
        ],
    )


def hardware_rows() -> list[Row]:
    """The hardware rows of the Job dashboard, in tier order: device, intra-node, inter-node."""
    return [
        _device_row(),
        _link_row("Hardware: NVLink", "nvlink", "NVLink data bytes of the job's GPUs."),
        _link_row("Hardware: PCIe", "pcie", "PCIe bytes of the job's GPUs (host <-> device)."),
        _link_row(
            "Hardware: network (NICs)",
            "ib|roce|ethernet",
            "InfiniBand / RoCE port data and Ethernet bytes of the job's nodes (once per node).",
        ),
    ]
