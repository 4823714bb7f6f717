"""The agent-to-collector report: one versioned, typed, torch-free schema both sides import.

Wire format (JSON, optionally gzip-compressed on the wire), one *batch* per POST, from one rank::

    {"schema": "mfuscope.report", "version": "1.4",
     "job": "llama-8b", "incarnation": "5f0c9a1e2b7d4c38",
     "rank": 3, "world_size": 16, "local_rank": 3, "host": "node-1", "node": "node-1",
     "device": "NVIDIA H100 80GB HBM3", "peak_flops": 9.89e14, "peak_source": "spec",
     "sent_unix_ns": 1763700000000000000,
     "health": {"reports_dropped_total": 0, "send_failures_total": 0,
                "profiler_failures_total": 0, "windows_analysed_total": 2},
     "topology": {"groups": [{"axis": "tp", "tier": "intra_node", "size": 8,
                              "spans_hosts": false, "link_peak_bytes_per_s": 4.5e11,
                              "link_peak_source": "nvml"}]},
     "hardware": {"memory_busy_ratio": 0.41, "sm_clock_ratio": 0.93, "power_watts": 655.0,
                  "energy_joules_total": 81234.5,
                  "links": [{"link": "nvlink", "direction": "tx", "bytes_total": 912345678}],
                  "link_peaks": [{"link": "nvlink", "bytes_per_s": 4.5e11}],
                  "throttle": [{"reason": "sw_power_cap", "seconds_total": 12.0}]},
     "reports": [{"step": 120, "start_unix_ns": ..., "wall_s": 0.81,
                  "model_flops": 3.1e14, "recompute_flops": 4.0e13,
                  "breakdown_step": 100,
                  "components": [{"component": "compute", "axis": "", "tier": "", "seconds": 0.6},
                                 {"component": "exposed_comm", "axis": "dp",
                                  "tier": "inter_node", "seconds": 0.21}],
                  "overlapped_comm_s": 0.3,
                  "collectives": [{"op": "all_reduce", "axis": "dp", "tier": "inter_node",
                                   "group_size": 16, "bytes": 104857600, "count": 4,
                                   "seconds": 0.5, "overlapped_s": 0.3}]}]}

Semantics:
- ``model_flops`` / ``recompute_flops`` are this rank's FLOPs for the step (recompute is the
  forward work redone under activation checkpointing: it counts for HFU, never for MFU).
- ``components`` split the step's ``wall_s`` into the step buckets; they come from the latest
  profiled window (``breakdown_step``) scaled to this step's wall time, so they sum to ``wall_s``.
  Empty means "no profiled window yet". ``axis``/``tier`` are set on ``exposed_comm`` only.
  A profiled step's own report carries its measured seconds, and the profiler's own cost on the
  training thread as the component ``instrumentation`` (since 1.3: a 1.2 collector refuses it).
- ``collectives`` appear only on the report of a profiled step, once per observed
  ``(op, axis, tier, group_size, bytes)``, so counters built from them never double count.
  ``group_size`` is ``null`` (since 1.1; absent reads as ``null``) when the rank could not tell
  which group ran the collective: its time and bytes still count, its bus bytes cannot.
- ``health`` counters are cumulative for the rank's agent process (monotonic).
- ``incarnation`` (since 1.1) names one launch of the job: made when the agents start, the same
  on every rank of that launch, different after a crash and relaunch under the same job name.
  ``(job, incarnation, rank, step)`` is the idempotency key: a re-sent report must not be counted
  twice, while a step a relaunched job runs again (resumed from a checkpoint) is new work. A batch
  without it (a 1.0 agent) belongs to one legacy incarnation, ``""``.
- ``node`` (since 1.1, optional) names the node the rank runs on: its node name
  (``MFUSCOPE_NODE_NAME`` / ``NODE_NAME``), else the host name of the node's lowest rank, the
  node being told by the kernel's boot id (docs/definitions.md#node-identity). ``host`` stays the
  rank's own host name (in Kubernetes, the pod's name).
- ``topology.groups[].link_peak_source`` (since 1.1, optional): where the group's spec came from
  (``datasheet``, ``sysfs``, ``nvml``, ``user``, or ``unknown`` with no ``link_peak_bytes_per_s``:
  no efficiency is computed against it; docs/definitions.md#link-specs).
- ``hardware`` (since 1.1, optional) holds the rank's hardware counters (`HardwareCounters`):
  gauges from the latest sample, and totals cumulative since the agent's sampler started. A
  counter the rank cannot read is absent from the record, never zero.

- ``comm`` (since 1.2, optional): the rank's always-on collective records from PyTorch's flight
  recorder: cumulative traffic per (op, axis, tier), its progress on each process group (what it
  waits in), arrival samples (`CommRecords`, documented in `collective_records`). A batch may
  carry no step reports: an agent whose steps stopped keeps sending its ``comm`` status.
- ``closing`` (since 1.2, optional, default false): the agent is closing (the job ended normally).
- ``run_key`` (since 1.3, optional): which runs are the same workload (docs/compare.md): the
  user's key, or the fingerprint of `mfuscope.core.run_key` once the rank's FLOPs per step are
  known; ``""`` before that and from older agents.
- ``ledger`` (since 1.4, optional): the agent's part of the job-time ledger (`LedgerTotals`,
  docs/definitions.md#job-time-ledger): its process's start on the wall clock and, cumulative,
  the nanoseconds of its startup, of each phase category and of its shutdown.

Versioning: ``version`` is ``MAJOR.MINOR``. A parser accepts its own major with any minor (unknown
fields of a newer minor are ignored) and rejects any other major. The records below are the one
definition of every 1.x version: each minor only added optional fields (marked "since 1.N"), so a
1.0 or 1.1 batch decodes into the same records with those fields at their defaults.

Extending the wire (a new minor): add the field with a default to its record (older agents leave it
out), say "since 1.N" beside it, bump `SCHEMA_VERSION`, and record a body of the new version
under tests/data/wire. A bound on one field is its type (`mfuscope.core._fields`); a rule across
fields goes in that record's ``check`` function, which names the field it refuses.
"""

from __future__ import annotations

import math
import re
from typing import Annotated, TypeVar

import msgspec
from mfuscope.core._fields import Count, Label, Name, UnixNanos, choice, count, number
from mfuscope.core._wire_errors import from_unreadable, from_validation
from mfuscope.core.collective_records import CommRecords, check_comm
from mfuscope.core.errors import SchemaError
from mfuscope.core.hwcounters import (
    HardwareCounters,
    LinkBytes,
    LinkPeak,
    ThrottleTime,
    check_hardware,
)
from mfuscope.core.ledger import LedgerTotals
from mfuscope.core.vocabulary import (
    COLLECTIVE_OPS,
    COMPONENTS,
    KERNEL_CLASSES,
    LINK_SPEC_SOURCES,
    LINK_SPEC_UNKNOWN,
    PEAK_SOURCES,
    TENSOR_AXIS,
    TIERS,
)
from msgspec import Meta, Struct, field
from msgspec.structs import force_setattr

__all__ = [
    "MAX_REPORTS_PER_BATCH",
    "SCHEMA_NAME",
    "SCHEMA_VERSION",
    "AgentHealth",
    "ClassShare",
    "CollectiveSample",
    "CommRecords",
    "ComponentShare",
    "GroupInfo",
    "HardwareCounters",
    "LedgerTotals",
    "LinkBytes",
    "LinkPeak",
    "ReportBatch",
    "SchemaError",
    "StepReport",
    "ThrottleTime",
    "Topology",
    "decode_batch",
    "encode_batch",
]

SCHEMA_NAME = "mfuscope.report"
SCHEMA_VERSION = "1.4"
_MAJOR = 1

# Sanity bounds: anything beyond these is a bug or an attack, not a training step.
MAX_REPORTS_PER_BATCH = 10_000
MAX_COLLECTIVES_PER_REPORT = 4_096
MAX_COMPONENTS_PER_REPORT = 512
MAX_GROUPS = 256
MAX_STEP_SECONDS = 86_400.0
MAX_FLOPS = 1e24  # FLOPs per step per rank; an exaFLOP device running a day is ~1e23
MAX_BYTES = 1 << 50
MAX_WORLD_SIZE = 1 << 20
# The shortest step (s) a report may carry: shorter is no training step, and a step of 1e-300 s
# would make FLOP rates (and so MFU) infinite.
MIN_STEP_SECONDS = 1e-6
# A collective that took any time took at least this long (s): bytes over a shorter time would
# make its bus bandwidth infinite. Zero stays allowed (a call the trace gave no duration).
MIN_COLLECTIVE_SECONDS = 1e-9
_VERSION_PATTERN = re.compile(r"([0-9]{1,6})\.([0-9]{1,6})", re.ASCII)
# Components must sum to wall_s to this relative tolerance (float rounding from scaling).
SUM_REL_TOL = 1e-6
SUM_ABS_TOL = 1e-9

_Seconds = Annotated[float, number(0.0, MAX_STEP_SECONDS)]
_Flops = Annotated[float, number(0.0, MAX_FLOPS)]
_Tier = Annotated[str, choice(TIERS)]
_WorldSize = Annotated[int, count(1, MAX_WORLD_SIZE)]
_RankIndex = Annotated[int, count(0, MAX_WORLD_SIZE)]


def _exceeds(value: float, limit: float) -> bool:
    """`value` is above `limit` by more than the summing tolerance."""
    return value > limit * (1 + SUM_REL_TOL) + SUM_ABS_TOL


# The records are frozen msgspec Structs: the wire definition itself (the agent encodes them, the
# collector decodes into them). ``kw_only``: a field the wire may leave out (it has a default) can
# come before one it may not. ``gc=False``: plain trees, never in a reference cycle.


class ComponentShare(Struct, frozen=True, gc=False):
    component: Annotated[str, choice(COMPONENTS)]
    seconds: _Seconds
    axis: Label = ""  # set on exposed_comm only, and required there
    tier: Annotated[str, choice(("", *TIERS))] = ""  # likewise


class ClassShare(Struct, frozen=True, gc=False):
    """Seconds of the step's compute bucket spent in kernels of one class (`KERNEL_CLASSES`)."""

    kernel_class: Annotated[str, choice(KERNEL_CLASSES)]
    seconds: Annotated[float, number(0.0, MAX_STEP_SECONDS)]


class CollectiveSample(Struct, frozen=True, kw_only=True, gc=False):
    op: Annotated[str, choice(COLLECTIVE_OPS)]
    axis: Name
    tier: _Tier
    # None (since 1.1; absent reads as None): the group is unknown (never the world size in its
    # place)
    group_size: _WorldSize | None = None
    bytes: Annotated[int, count(0, MAX_BYTES)] | None = None  # None: size unknown
    count: Annotated[int, count(1, 1 << 32)]
    seconds: _Seconds  # zero, or at least MIN_COLLECTIVE_SECONDS
    overlapped_s: _Seconds  # at most `seconds`


class StepReport(Struct, frozen=True, gc=False):
    step: Count
    start_unix_ns: UnixNanos
    wall_s: Annotated[float, number(MIN_STEP_SECONDS, MAX_STEP_SECONDS)]
    model_flops: _Flops
    recompute_flops: _Flops = 0.0
    # Sum to `wall_s`; empty: no profiled window yet.
    components: Annotated[
        tuple[ComponentShare, ...], Meta(max_length=MAX_COMPONENTS_PER_REPORT)
    ] = ()
    overlapped_comm_s: _Seconds = 0.0  # at most `wall_s`
    breakdown_step: Count | None = None
    collectives: Annotated[
        tuple[CollectiveSample, ...], Meta(max_length=MAX_COLLECTIVES_PER_REPORT)
    ] = ()
    # Since 1.1, optional: the compute component split by kernel class (from the profiled
    # window `breakdown_step`, like `components`); empty when not known. Each class once, summing
    # to at most `wall_s`.
    compute_classes: Annotated[tuple[ClassShare, ...], Meta(max_length=len(KERNEL_CLASSES))] = ()

    @property
    def hardware_flops(self) -> float:
        return self.model_flops + self.recompute_flops


class AgentHealth(Struct, frozen=True, gc=False):
    reports_dropped_total: Count = 0
    send_failures_total: Count = 0
    profiler_failures_total: Count = 0
    windows_analysed_total: Count = 0


class GroupInfo(Struct, frozen=True, gc=False):
    axis: Name
    tier: _Tier
    size: _WorldSize
    spans_hosts: bool
    link_peak_bytes_per_s: Annotated[float, number(0.0, 1e15)] | None = None
    # Since 1.1, optional: where the spec came from (`LINK_SPEC_SOURCES`); ``unknown`` comes with
    # no rate. None: not stated (an older agent).
    link_peak_source: Annotated[str, choice(LINK_SPEC_SOURCES)] | None = None


class Topology(Struct, frozen=True, gc=False):
    groups: Annotated[tuple[GroupInfo, ...], Meta(max_length=MAX_GROUPS)] = ()

    @property
    def tp_spans_hosts(self) -> bool:
        return any(g.axis == TENSOR_AXIS and g.spans_hosts for g in self.groups)


class ReportBatch(Struct, frozen=True, kw_only=True, gc=False):
    job: Name
    rank: _RankIndex  # below `world_size`
    world_size: _WorldSize
    host: Name
    device: Name
    peak_flops: Annotated[float, number(1.0, 1e18)] | None = None  # None only with "unknown"
    peak_source: Annotated[str, choice(PEAK_SOURCES)]
    sent_unix_ns: UnixNanos
    reports: Annotated[tuple[StepReport, ...], Meta(max_length=MAX_REPORTS_PER_BATCH)]
    local_rank: _RankIndex = 0
    health: AgentHealth = field(default_factory=AgentHealth)
    topology: Topology | None = None
    incarnation: Label = ""  # since 1.1
    hardware: HardwareCounters | None = None  # since 1.1
    node: Label = ""  # since 1.1: the rank's node label ("" when the agent sent none)
    comm: CommRecords | None = None  # since 1.2: always-on collective records
    closing: bool = False  # since 1.2: the agent is closing (a normal end)
    run_key: Label = ""  # since 1.3: which runs are the same workload ("" when not known)
    ledger: LedgerTotals | None = None  # since 1.4: the agent's part of the job-time ledger


# --- the rules no single field states ------------------------------------------------------------


# The checks raise `SchemaError` on a field relative to the record; `_within` prefixes the
# record's own path, on the error path only (no path strings are built for a valid batch).


def _within(prefix: str, exc: SchemaError) -> SchemaError:
    return SchemaError(f"{prefix}.{exc.field}", exc.message)


def _check_component(c: ComponentShare) -> None:
    if c.component == "exposed_comm":
        if not c.axis:
            raise SchemaError("axis", "required on exposed_comm")
        if not c.tier:
            raise SchemaError("tier", f"required on exposed_comm: {', '.join(TIERS)}")
    elif c.axis or c.tier:
        raise SchemaError("axis", f"only exposed_comm carries axis/tier, not {c.component}")


def _check_collective(c: CollectiveSample) -> None:
    if 0 < c.seconds < MIN_COLLECTIVE_SECONDS:
        raise SchemaError("seconds", f"{c.seconds!r} is below {MIN_COLLECTIVE_SECONDS} s")
    if c.overlapped_s > c.seconds:
        if _exceeds(c.overlapped_s, c.seconds):
            raise SchemaError("overlapped_s", f"{c.overlapped_s} exceeds seconds {c.seconds}")
        force_setattr(c, "overlapped_s", c.seconds)  # float rounding; freshly decoded, not shared


def _check_report(r: StepReport) -> None:
    wall_s = r.wall_s
    if r.overlapped_comm_s > wall_s:
        if _exceeds(r.overlapped_comm_s, wall_s):
            raise SchemaError(
                "overlapped_comm_s", f"{r.overlapped_comm_s!r} exceeds wall_s {wall_s!r}"
            )
        force_setattr(r, "overlapped_comm_s", wall_s)
    components = r.components
    if components:
        for i, c in enumerate(components):
            if c.axis or c.tier or c.component == "exposed_comm":
                try:
                    _check_component(c)
                except SchemaError as exc:
                    raise _within(f"components[{i}]", exc) from None
        total = math.fsum([c.seconds for c in components])
        if not math.isclose(total, wall_s, rel_tol=SUM_REL_TOL, abs_tol=SUM_ABS_TOL):
            raise SchemaError("components", f"seconds sum to {total!r}, not to wall_s {wall_s!r}")
    for i, sample in enumerate(r.collectives):
        try:
            _check_collective(sample)
        except SchemaError as exc:
            raise _within(f"collectives[{i}]", exc) from None
    shares = r.compute_classes
    if shares:
        for i, share in enumerate(shares):
            if share.seconds > wall_s:
                raise SchemaError(
                    f"compute_classes[{i}].seconds", f"{share.seconds!r} exceeds wall_s {wall_s!r}"
                )
        if len({s.kernel_class for s in shares}) != len(shares):
            raise SchemaError("compute_classes", "a kernel class appears twice")
        total = math.fsum([s.seconds for s in shares])
        if _exceeds(total, wall_s):
            raise SchemaError(
                "compute_classes", f"seconds sum to {total!r}, more than wall_s {wall_s!r}"
            )


def _check_topology(topology: Topology) -> None:
    for i, g in enumerate(topology.groups):
        source = g.link_peak_source
        if source is not None and (source == LINK_SPEC_UNKNOWN) != (
            g.link_peak_bytes_per_s is None
        ):
            raise SchemaError(
                f"topology.groups[{i}].link_peak_source",
                "'unknown' exactly when link_peak_bytes_per_s is absent",
            )


def check_batch(batch: ReportBatch) -> None:
    """The rules of a decoded batch that no single field states (the field types state the
    rest). Raises `SchemaError` naming the field. An overlap over its total by float rounding
    (within the summing tolerance) is clamped to the total, in place: call it on a freshly
    decoded batch only."""
    if batch.rank >= batch.world_size:
        raise SchemaError("rank", f"{batch.rank} is not below world_size {batch.world_size}")
    if batch.peak_flops is None and batch.peak_source != "unknown":
        raise SchemaError("peak_flops", f"missing although peak_source is {batch.peak_source!r}")
    steps = set()
    for i, report in enumerate(batch.reports):
        try:
            _check_report(report)
        except SchemaError as exc:
            raise _within(f"reports[{i}]", exc) from None
        steps.add(report.step)
    if len(steps) != len(batch.reports):
        raise SchemaError("reports", "the same step appears twice in one batch")
    if batch.topology is not None:
        _check_topology(batch.topology)
    if batch.hardware is not None:
        check_hardware(batch.hardware)
    if batch.comm is not None:
        check_comm(batch.comm)


# --- decoding ------------------------------------------------------------------------------------


class _Header(Struct):
    """The two fields read before the rest: a batch of another schema or major is refused as
    such, whatever else it holds."""

    schema: object = None
    version: object = None


_DECODER = msgspec.json.Decoder(ReportBatch)
_HEADER_DECODER = msgspec.json.Decoder(_Header)
_ENCODER = msgspec.json.Encoder()
# What this side's encoder writes first; a body that starts so needs no separate header read.
_PREFIX = f'{{"schema":"{SCHEMA_NAME}","version":"{_MAJOR}.'.encode()
_SAME_MAJOR = re.compile(rb"[0-9]{1,6}\",")


def _check_header(header: _Header) -> None:
    if header.schema is None:
        raise SchemaError("schema", "missing")
    if header.schema != SCHEMA_NAME:
        raise SchemaError("schema", f"expected {SCHEMA_NAME!r}, got {header.schema!r}"[:300])
    version = header.version
    if version is None:
        raise SchemaError("version", "missing")
    if not isinstance(version, str):
        raise SchemaError("version", f"expected a string, got {type(version).__name__}")
    match = _VERSION_PATTERN.fullmatch(version)
    if match is None:  # ASCII digits only: "1.\u00b2" is no version
        raise SchemaError("version", f"expected MAJOR.MINOR, got {version!r}"[:300])
    major = match.group(1)
    if int(major) != _MAJOR:
        raise SchemaError(
            "version", f"unsupported major version {major} (this side speaks {SCHEMA_VERSION})"
        )


_T = TypeVar("_T")


def _decode(decoder: msgspec.json.Decoder[_T], data: bytes) -> _T:
    """One msgspec decode, its errors mapped to `SchemaError` (``body`` for text that is not
    JSON, the field's path for a value of the wrong type)."""
    try:
        return decoder.decode(data)
    except msgspec.ValidationError as exc:
        raise from_validation(exc) from None
    except (msgspec.DecodeError, UnicodeDecodeError, RecursionError) as exc:
        raise from_unreadable(data, str(exc)) from None


def decode_batch(body: bytes | str) -> ReportBatch:
    """Decode and validate one batch from its JSON body: the field types checked as msgspec
    decodes, then `check_batch`. Raises `SchemaError` naming the bad field (``body`` for text
    that is not JSON); a version of another major is refused on ``version`` before anything
    else is read."""
    data = body.encode("utf-8", "surrogatepass") if isinstance(body, str) else body
    if not (data.startswith(_PREFIX) and _SAME_MAJOR.match(data, len(_PREFIX))):
        _check_header(_decode(_HEADER_DECODER, data))
    batch = _decode(_DECODER, data)
    check_batch(batch)
    return batch


# --- encoding ------------------------------------------------------------------------------------

_HEAD = f'{{"schema":"{SCHEMA_NAME}","version":"{SCHEMA_VERSION}",'.encode()


def encode_batch(batch: ReportBatch) -> bytes:
    """Encode a batch in the wire format (compact JSON, UTF-8): what an agent sends, and what
    `decode_batch` reads back."""
    return _HEAD + _ENCODER.encode(batch)[1:]
