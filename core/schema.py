"""The agent-to-collector report: one versioned, typed, torch-free schema both sides import.

Wire format (JSON, optionally gzip-compressed on the wire), one *batch* per POST, from one rank::

    {"schema": "mfuscope.report", "version": "1.2",
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

Versioning: ``version`` is ``MAJOR.MINOR``. A parser accepts its own major with any minor (unknown
fields of a newer minor are ignored) and rejects any other major.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from mfuscope.core._fields import choice as _enum
from mfuscope.core._fields import entries as _list
from mfuscope.core._fields import flag as _flag
from mfuscope.core._fields import integer as _int
from mfuscope.core._fields import number as _float
from mfuscope.core._fields import obj as _obj
from mfuscope.core._fields import required as _get
from mfuscope.core._fields import text as _str
from mfuscope.core.collective_records import CommRecords, parse_comm
from mfuscope.core.errors import SchemaError
from mfuscope.core.hwcounters import (
    HardwareCounters,
    LinkBytes,
    LinkPeak,
    ThrottleTime,
    parse_hardware,
)
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
    "LinkBytes",
    "LinkPeak",
    "ReportBatch",
    "StepReport",
    "ThrottleTime",
    "Topology",
    "batch_from_json",
    "batch_to_dict",
    "batch_to_json",
    "parse_batch",
]

SCHEMA_NAME = "mfuscope.report"
SCHEMA_VERSION = "1.2"
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


def _exceeds(value: float, limit: float) -> bool:
    """`value` is above `limit` by more than the summing tolerance."""
    return value > limit * (1 + SUM_REL_TOL) + SUM_ABS_TOL


@dataclass(frozen=True)
class ComponentShare:
    component: str
    seconds: float
    axis: str = ""
    tier: str = ""


@dataclass(frozen=True)
class ClassShare:
    """Seconds of the step's compute bucket spent in kernels of one class (`KERNEL_CLASSES`)."""

    kernel_class: str
    seconds: float


@dataclass(frozen=True)
class CollectiveSample:
    op: str
    axis: str
    tier: str
    group_size: int | None  # None: the group is unknown (never the world size in its place)
    bytes: int | None  # None: size unknown (e.g. a kernel without metadata)
    count: int
    seconds: float
    overlapped_s: float


@dataclass(frozen=True)
class StepReport:
    step: int
    start_unix_ns: int
    wall_s: float
    model_flops: float
    recompute_flops: float
    components: tuple[ComponentShare, ...] = ()
    overlapped_comm_s: float = 0.0
    breakdown_step: int | None = None
    collectives: tuple[CollectiveSample, ...] = ()
    # Since 1.1, optional: the compute component split by kernel class (from the profiled
    # window `breakdown_step`, like `components`); empty when not known.
    compute_classes: tuple[ClassShare, ...] = ()

    @property
    def hardware_flops(self) -> float:
        return self.model_flops + self.recompute_flops


@dataclass(frozen=True)
class AgentHealth:
    reports_dropped_total: int = 0
    send_failures_total: int = 0
    profiler_failures_total: int = 0
    windows_analysed_total: int = 0


@dataclass(frozen=True)
class GroupInfo:
    axis: str
    tier: str
    size: int
    spans_hosts: bool
    link_peak_bytes_per_s: float | None = None
    # Since 1.1, optional: where the spec came from (`LINK_SPEC_SOURCES`); ``unknown`` comes with
    # no rate. None: not stated (an older agent).
    link_peak_source: str | None = None


@dataclass(frozen=True)
class Topology:
    groups: tuple[GroupInfo, ...] = ()

    @property
    def tp_spans_hosts(self) -> bool:
        return any(g.axis == TENSOR_AXIS and g.spans_hosts for g in self.groups)


@dataclass(frozen=True)
class ReportBatch:
    job: str
    rank: int
    world_size: int
    host: str
    device: str
    peak_flops: float | None
    peak_source: str
    sent_unix_ns: int
    reports: tuple[StepReport, ...]
    local_rank: int = 0
    health: AgentHealth = field(default_factory=AgentHealth)
    topology: Topology | None = None
    incarnation: str = ""
    hardware: HardwareCounters | None = None
    node: str = ""  # since 1.1: the rank's node label ("" when the agent sent none)
    comm: CommRecords | None = None  # since 1.2: always-on collective records
    closing: bool = False  # since 1.2: the agent is closing (a normal end)


# --- parsing -------------------------------------------------------------------------------------


def _parse_component(raw: Any, path: str) -> ComponentShare:
    obj = _obj(raw, path)
    component = _enum(_get(obj, "component", f"{path}."), f"{path}.component", COMPONENTS)
    axis = _str(obj.get("axis", ""), f"{path}.axis", allow_empty=True)
    tier = _str(obj.get("tier", ""), f"{path}.tier", allow_empty=True)
    if component == "exposed_comm":
        if not axis:
            raise SchemaError(f"{path}.axis", "required on exposed_comm")
        _enum(tier, f"{path}.tier", TIERS)
    elif axis or tier:
        raise SchemaError(f"{path}.axis", f"only exposed_comm carries axis/tier, not {component}")
    seconds = _float(_get(obj, "seconds", f"{path}."), f"{path}.seconds", hi=MAX_STEP_SECONDS)
    return ComponentShare(component=component, seconds=seconds, axis=axis, tier=tier)


def _parse_collective(raw: Any, path: str) -> CollectiveSample:
    obj = _obj(raw, path)
    size = obj.get("bytes")
    group_size = obj.get("group_size")
    seconds = _float(_get(obj, "seconds", f"{path}."), f"{path}.seconds", hi=MAX_STEP_SECONDS)
    if 0 < seconds < MIN_COLLECTIVE_SECONDS:
        raise SchemaError(f"{path}.seconds", f"{seconds!r} is below {MIN_COLLECTIVE_SECONDS} s")
    overlapped = _float(
        _get(obj, "overlapped_s", f"{path}."), f"{path}.overlapped_s", hi=MAX_STEP_SECONDS
    )
    if _exceeds(overlapped, seconds):
        raise SchemaError(f"{path}.overlapped_s", f"{overlapped} exceeds seconds {seconds}")
    return CollectiveSample(
        op=_enum(_get(obj, "op", f"{path}."), f"{path}.op", COLLECTIVE_OPS),
        axis=_str(_get(obj, "axis", f"{path}."), f"{path}.axis"),
        tier=_enum(_get(obj, "tier", f"{path}."), f"{path}.tier", TIERS),
        group_size=None
        if group_size is None
        else _int(group_size, f"{path}.group_size", lo=1, hi=MAX_WORLD_SIZE),
        bytes=None if size is None else _int(size, f"{path}.bytes", hi=MAX_BYTES),
        count=_int(_get(obj, "count", f"{path}."), f"{path}.count", lo=1, hi=1 << 32),
        seconds=seconds,
        overlapped_s=min(overlapped, seconds),
    )


def _parse_classes(raw: Any, path: str, wall_s: float) -> tuple[ClassShare, ...]:
    entries = _list(raw, path, len(KERNEL_CLASSES))
    shares = []
    for i, entry in enumerate(entries):
        obj = _obj(entry, f"{path}[{i}]")
        shares.append(
            ClassShare(
                kernel_class=_enum(
                    _get(obj, "kernel_class", f"{path}[{i}]."),
                    f"{path}[{i}].kernel_class",
                    KERNEL_CLASSES,
                ),
                seconds=_float(
                    _get(obj, "seconds", f"{path}[{i}]."), f"{path}[{i}].seconds", hi=wall_s
                ),
            )
        )
    if len({s.kernel_class for s in shares}) != len(shares):
        raise SchemaError(path, "a kernel class appears twice")
    total = math.fsum(s.seconds for s in shares)
    if _exceeds(total, wall_s):
        raise SchemaError(path, f"seconds sum to {total!r}, more than wall_s {wall_s!r}")
    return tuple(shares)


def _parse_report(raw: Any, path: str) -> StepReport:
    obj = _obj(raw, path)
    wall_s = _float(_get(obj, "wall_s", f"{path}."), f"{path}.wall_s", hi=MAX_STEP_SECONDS)
    if wall_s < MIN_STEP_SECONDS:
        raise SchemaError(f"{path}.wall_s", f"{wall_s!r} is below {MIN_STEP_SECONDS} s")
    overlapped_comm_s = _float(
        obj.get("overlapped_comm_s", 0.0), f"{path}.overlapped_comm_s", hi=MAX_STEP_SECONDS
    )
    if _exceeds(overlapped_comm_s, wall_s):
        raise SchemaError(
            f"{path}.overlapped_comm_s", f"{overlapped_comm_s!r} exceeds wall_s {wall_s!r}"
        )
    components = tuple(
        _parse_component(c, f"{path}.components[{i}]")
        for i, c in enumerate(
            _list(obj.get("components", []), f"{path}.components", MAX_COMPONENTS_PER_REPORT)
        )
    )
    if components:
        total = math.fsum(c.seconds for c in components)
        if not math.isclose(total, wall_s, rel_tol=SUM_REL_TOL, abs_tol=SUM_ABS_TOL):
            raise SchemaError(
                f"{path}.components", f"seconds sum to {total!r}, not to wall_s {wall_s!r}"
            )
    breakdown_step = obj.get("breakdown_step")
    return StepReport(
        step=_int(_get(obj, "step", f"{path}."), f"{path}.step"),
        start_unix_ns=_int(_get(obj, "start_unix_ns", f"{path}."), f"{path}.start_unix_ns"),
        wall_s=wall_s,
        model_flops=_float(
            _get(obj, "model_flops", f"{path}."), f"{path}.model_flops", hi=MAX_FLOPS
        ),
        recompute_flops=_float(
            obj.get("recompute_flops", 0.0), f"{path}.recompute_flops", hi=MAX_FLOPS
        ),
        components=components,
        overlapped_comm_s=min(overlapped_comm_s, wall_s),
        breakdown_step=None
        if breakdown_step is None
        else _int(breakdown_step, f"{path}.breakdown_step"),
        collectives=tuple(
            _parse_collective(c, f"{path}.collectives[{i}]")
            for i, c in enumerate(
                _list(obj.get("collectives", []), f"{path}.collectives", MAX_COLLECTIVES_PER_REPORT)
            )
        ),
        compute_classes=_parse_classes(
            obj.get("compute_classes", []), f"{path}.compute_classes", wall_s
        ),
    )


def _parse_health(raw: Any) -> AgentHealth:
    obj = _obj(raw, "health")
    return AgentHealth(
        **{
            name: _int(obj.get(name, 0), f"health.{name}")
            for name in AgentHealth.__dataclass_fields__
        }
    )


def _parse_topology(raw: Any) -> Topology | None:
    if raw is None:
        return None
    obj = _obj(raw, "topology")
    groups = []
    for i, g in enumerate(_list(obj.get("groups", []), "topology.groups", MAX_GROUPS)):
        path = f"topology.groups[{i}]"
        gobj = _obj(g, path)
        peak = gobj.get("link_peak_bytes_per_s")
        source = gobj.get("link_peak_source")
        if source is not None:
            source = _enum(source, f"{path}.link_peak_source", LINK_SPEC_SOURCES)
            if (source == LINK_SPEC_UNKNOWN) != (peak is None):
                raise SchemaError(
                    f"{path}.link_peak_source",
                    "'unknown' exactly when link_peak_bytes_per_s is absent",
                )
        spans = _flag(_get(gobj, "spans_hosts", f"{path}."), f"{path}.spans_hosts")
        groups.append(
            GroupInfo(
                axis=_str(_get(gobj, "axis", f"{path}."), f"{path}.axis"),
                tier=_enum(_get(gobj, "tier", f"{path}."), f"{path}.tier", TIERS),
                size=_int(_get(gobj, "size", f"{path}."), f"{path}.size", lo=1, hi=MAX_WORLD_SIZE),
                spans_hosts=spans,
                link_peak_bytes_per_s=None
                if peak is None
                else _float(peak, f"{path}.link_peak_bytes_per_s", hi=1e15),
                link_peak_source=source,
            )
        )
    return Topology(groups=tuple(groups))


def _check_version(obj: Mapping[str, Any]) -> None:
    if _get(obj, "schema", "") != SCHEMA_NAME:
        raise SchemaError("schema", f"expected {SCHEMA_NAME!r}, got {obj['schema']!r}")
    version = _str(_get(obj, "version", ""), "version")
    match = _VERSION_PATTERN.fullmatch(version)
    if match is None:  # ASCII digits only: "1.\u00b2" is no version
        raise SchemaError("version", f"expected MAJOR.MINOR, got {version!r}")
    major = match.group(1)
    if int(major) != _MAJOR:
        raise SchemaError(
            "version", f"unsupported major version {major} (this side speaks {SCHEMA_VERSION})"
        )


def parse_batch(raw: Any) -> ReportBatch:
    """Validate a decoded JSON value as a batch. Raises `SchemaError` naming the bad field."""
    obj = _obj(raw, "batch")
    _check_version(obj)
    world_size = _int(_get(obj, "world_size", ""), "world_size", lo=1, hi=MAX_WORLD_SIZE)
    rank = _int(_get(obj, "rank", ""), "rank", hi=MAX_WORLD_SIZE)
    if rank >= world_size:
        raise SchemaError("rank", f"{rank} is not below world_size {world_size}")
    peak = obj.get("peak_flops")
    peak_source = _enum(_get(obj, "peak_source", ""), "peak_source", PEAK_SOURCES)
    if peak is None and peak_source != "unknown":
        raise SchemaError("peak_flops", f"missing although peak_source is {peak_source!r}")
    reports_raw = _list(_get(obj, "reports", ""), "reports", MAX_REPORTS_PER_BATCH)
    reports = tuple(_parse_report(r, f"reports[{i}]") for i, r in enumerate(reports_raw))
    steps = [r.step for r in reports]
    if len(set(steps)) != len(steps):
        raise SchemaError("reports", "the same step appears twice in one batch")
    return ReportBatch(
        job=_str(_get(obj, "job", ""), "job"),
        rank=rank,
        world_size=world_size,
        local_rank=_int(obj.get("local_rank", 0), "local_rank", hi=MAX_WORLD_SIZE),
        host=_str(_get(obj, "host", ""), "host"),
        device=_str(_get(obj, "device", ""), "device"),
        peak_flops=None if peak is None else _float(peak, "peak_flops", lo=1.0, hi=1e18),
        peak_source=peak_source,
        sent_unix_ns=_int(_get(obj, "sent_unix_ns", ""), "sent_unix_ns"),
        reports=reports,
        health=_parse_health(obj.get("health", {})),
        topology=_parse_topology(obj.get("topology")),
        incarnation=_str(obj.get("incarnation", ""), "incarnation", allow_empty=True),
        hardware=parse_hardware(obj.get("hardware")),
        node=_str(obj.get("node", ""), "node", allow_empty=True),
        comm=parse_comm(obj.get("comm")),
        closing=_flag(obj.get("closing", False), "closing"),
    )


def batch_from_json(text: str | bytes) -> ReportBatch:
    """Decode and validate one batch. Raises `SchemaError` (also for text that is not JSON)."""
    try:
        raw = json.loads(text)
    except (ValueError, UnicodeDecodeError) as exc:
        raise SchemaError("body", f"not JSON: {exc}") from None
    return parse_batch(raw)


def batch_to_dict(batch: ReportBatch) -> dict[str, Any]:
    body = asdict(batch)
    return {"schema": SCHEMA_NAME, "version": SCHEMA_VERSION, **body}


def batch_to_json(batch: ReportBatch) -> str:
    """Encode a batch in the wire format (compact JSON)."""
    return json.dumps(batch_to_dict(batch), separators=(",", ":"), allow_nan=False)
