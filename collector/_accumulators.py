"""Accumulators of the aggregation state: cumulative counters of one job (or rank), the
step-time histogram, and per-``(op, axis, tier)`` collective totals. Plain mutable data, no I/O.

Collective totals have two sources (docs/definitions.md#collective-records). A profiled window's
samples count everything when the rank sends no flight-recorder records (an older agent, or the
recorder off). When it does, the records are the source of the traffic (`COUNTS`: calls, bytes,
bus bytes) and, where the backend gives durations, of the times (`TIMES`: seconds, sized seconds,
sized bus bytes); the window's samples then add only what only windows know (`WINDOW`: overlapped
seconds, and the seconds they were measured against) and, without durations, the times. A
recorder that does not record point-to-point ops (gloo) leaves send/recv to the windows whole."""

from __future__ import annotations

import bisect
import math

from mfuscope.collector._snapshot import STEP_DURATION_BOUNDS_S
from mfuscope.core.bandwidth import bus_factor
from mfuscope.core.collective_records import CollectiveTraffic
from mfuscope.core.ledger import CATEGORIES, Booked
from mfuscope.core.schema import CollectiveSample, StepReport
from mfuscope.core.vocabulary import P2P_OPS, component_axis

__all__ = [
    "ALL_PARTS",
    "COUNTS",
    "TIMES",
    "WINDOW",
    "CollectiveAcc",
    "CollectiveTerms",
    "HistogramAcc",
    "SeriesAcc",
]

# Which parts of a profiled window's collective sample to count (see the module docstring).
COUNTS = 1
TIMES = 2
WINDOW = 4
ALL_PARTS = COUNTS | TIMES | WINDOW

_CATEGORY_INDEX = {category: i for i, category in enumerate(CATEGORIES)}

# (calls, bytes, bus_bytes, seconds, overlapped_seconds, sized_seconds): one rank's contribution.
CollectiveTerms = tuple[int, float, float, float, float, float]


class CollectiveAcc:
    __slots__ = (
        "bus_bytes",
        "bytes",
        "calls",
        "overlapped",
        "profiled_seconds",
        "seconds",
        "sized_bus_bytes",
        "sized_seconds",
    )

    def __init__(self) -> None:
        self.calls = 0
        self.bytes = 0.0
        self.bus_bytes = 0.0
        self.seconds = 0.0
        self.overlapped = 0.0
        self.sized_seconds = 0.0
        # The busbw numerator: bus bytes of exactly the calls in `sized_seconds`.
        self.sized_bus_bytes = 0.0
        # Collective seconds inside profiled windows: the denominator of `overlapped`.
        self.profiled_seconds = 0.0

    def add(self, c: CollectiveSample, parts: int = ALL_PARTS) -> None:
        # `bytes` is the per-call size S; `seconds` covers all `count` calls (schema).
        size = None if c.bytes is None else float(c.bytes) * c.count
        # The bus factor needs n: no bus bytes without it.
        factor = None if c.group_size is None else bus_factor(c.op, c.group_size)
        if parts & COUNTS:
            self.calls += c.count
            if size is not None:
                self.bytes += size
                if factor is not None:
                    self.bus_bytes += size * factor
        if parts & TIMES:
            self.seconds += c.seconds
            if size is not None and factor is not None:
                self.sized_seconds += c.seconds
                self.sized_bus_bytes += size * factor
        if parts & WINDOW:
            self.overlapped += c.overlapped_s
            self.profiled_seconds += c.seconds

    def add_traffic(self, t: CollectiveTraffic, times: bool) -> None:
        """Add a flight-recorder traffic increment (`times`: its durations count too)."""
        factor = None if t.group_size is None else bus_factor(t.op, t.group_size)
        self.calls += t.calls
        self.bytes += t.bytes
        if factor is not None:
            self.bus_bytes += t.bytes * factor
        if times:
            self.seconds += t.seconds
            if factor is not None:
                self.sized_seconds += t.sized_seconds
                self.sized_bus_bytes += t.sized_bytes * factor

    @classmethod
    def from_sums(cls, values: tuple[float, ...]) -> CollectiveAcc:
        """An accumulator holding summed `CollectiveTerms` (calls arrive as a float)."""
        acc = cls()
        calls, acc.bytes, acc.bus_bytes, acc.seconds, acc.overlapped, acc.sized_seconds = values
        acc.calls = round(calls)
        return acc

    def terms(self) -> CollectiveTerms:
        return (
            self.calls,
            self.bytes,
            self.bus_bytes,
            self.seconds,
            self.overlapped,
            self.sized_seconds,
        )


class HistogramAcc:
    __slots__ = ("counts", "max", "min", "sum")

    def __init__(self) -> None:
        self.counts = [0] * (len(STEP_DURATION_BOUNDS_S) + 1)
        self.sum = 0.0
        self.min = math.inf
        self.max = -math.inf

    def observe(self, value: float) -> None:
        # bisect_left: the first bound >= value, so a bucket's upper bound is inclusive (`le`).
        self.counts[bisect.bisect_left(STEP_DURATION_BOUNDS_S, value)] += 1
        self.sum += value
        self.min = min(self.min, value)
        self.max = max(self.max, value)


class SeriesAcc:
    """The counters of one job, or of one rank when per-rank labels are on."""

    __slots__ = (
        "collectives",
        "components",
        "compute_classes",
        "duplicates",
        "hardware_flops",
        "histogram",
        "model_flops",
        "overlapped",
        "peak_flop_seconds",
        "reruns",
        "start_unix_ns",
        "step_seconds",
        "steps",
        "time_ns",
        "time_peak_flop_seconds",
        "useful_model_flops",
    )

    def __init__(self, start_unix_ns: int) -> None:
        self.start_unix_ns = start_unix_ns
        self.steps = 0
        self.step_seconds = 0.0
        self.model_flops = 0.0
        self.hardware_flops = 0.0
        # Sum of the rank's dense peak FLOP/s x step wall time: the MFU denominator as a counter.
        self.peak_flop_seconds = 0.0
        self.overlapped = 0.0
        self.duplicates = 0
        # Counted steps that re-ran a step number an earlier incarnation had reported.
        self.reruns = 0
        self.components: dict[tuple[str, str, str], float] = {}
        self.compute_classes: dict[str, float] = {}  # kernel class -> compute seconds
        self.collectives: dict[tuple[str, str, str], CollectiveAcc] = {}
        self.histogram = HistogramAcc()
        # The job-time ledger (docs/definitions.md#job-time-ledger): integer ns per category (in
        # the order of `CATEGORIES`: exact sums), the peak FLOP/s x those seconds (the effective
        # MFU denominator) and the model FLOPs of steps not redone (its numerator).
        self.time_ns = [0] * len(CATEGORIES)
        self.time_peak_flop_seconds = 0.0
        self.useful_model_flops = 0.0

    def add(
        self,
        r: StepReport,
        peak_flops: float | None,
        parts: int = ALL_PARTS,
        p2p_parts: int = ALL_PARTS,
    ) -> None:
        """Count one step of a rank whose device peak is `peak_flops` (FLOP/s; None: unknown, the
        step then adds nothing to `peak_flop_seconds`); `parts` of its window's collective
        samples count, `p2p_parts` of its send/recv samples (see the module docstring)."""
        self.steps += 1
        self.step_seconds += r.wall_s
        self.model_flops += r.model_flops
        self.hardware_flops += r.hardware_flops
        if peak_flops is not None:
            self.peak_flop_seconds += peak_flops * r.wall_s
        self.overlapped += r.overlapped_comm_s
        self.histogram.observe(r.wall_s)
        components = self.components
        for c in r.components:
            key = (c.component, component_axis(c.component, c.axis), c.tier)
            components[key] = components.get(key, 0.0) + c.seconds
        classes = self.compute_classes
        for share in r.compute_classes:
            classes[share.kernel_class] = classes.get(share.kernel_class, 0.0) + share.seconds
        for sample in r.collectives:
            chosen = p2p_parts if sample.op in P2P_OPS else parts
            self._collective(sample.op, sample.axis, sample.tier).add(sample, chosen)

    def add_time(self, booked: Booked, peak_flops: float | None) -> None:
        """Count what the ledger booked for one rank whose device peak is `peak_flops`."""
        time_ns = self.time_ns
        total = 0
        for category, ns in booked:
            time_ns[_CATEGORY_INDEX[category]] += ns
            total += ns
        if peak_flops is not None:
            self.time_peak_flop_seconds += peak_flops * total / 1e9

    def add_traffic(self, traffic: CollectiveTraffic, times: bool) -> None:
        """Count a flight-recorder traffic increment of one rank."""
        self._collective(traffic.op, traffic.axis, traffic.tier).add_traffic(traffic, times)

    def _collective(self, op: str, axis: str, tier: str) -> CollectiveAcc:
        key = (op, axis, tier)
        acc = self.collectives.get(key)
        if acc is None:
            acc = self.collectives[key] = CollectiveAcc()
        return acc
