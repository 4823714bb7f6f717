"""The engine's event model: the few fields of a Kineto trace that the analysis reads.

A Kineto event carries a dozen keys and an ``args`` object of up to thirty more; the engine
reads eight and sixteen of them. Decoding straight into these `msgspec` Structs skips every
other key inside the decoder, without building a dict per event (``benchmarks/analyze_bench.py``;
figures: benchmarks/RESULTS.md#reading). A
trace that is already a decoded dict (tests, ``load_trace``) is converted into the same model,
so the engine has one input type.

The Structs are frozen and opt out of the cyclic GC (``gc=False``): they only ever hold
numbers, strings, JSON lists and other such Structs, so they cannot form reference cycles, and
millions of tracked objects would make every collection walk them all.

The annotations here are evaluated when the classes are made (no ``from __future__ import
annotations``): building the decoder resolves the fields of each of the 27 tagged event
classes below, and annotations kept as strings would be compiled and evaluated again for each,
at every start of `mfuscope analyze` (figures: benchmarks/RESULTS.md#whole-process-and-start-up).
"""

import functools
import operator
from collections.abc import Mapping, Sequence
from typing import Any, Literal, cast, get_args

import msgspec
from mfuscope.core.errors import TraceError

__all__ = [
    "EventArgs",
    "KinetoTrace",
    "TraceEvent",
    "as_kineto_trace",
    "decode_kineto",
    "describe_validation_error",
]


class EventArgs(msgspec.Struct, frozen=True, gc=False):
    """The ``args`` keys the engine reads (names as PyTorch writes them); None when absent.

    Values keep their JSON type (the engine checks them where it uses them):
    ``correlation`` links a device event to its host launch; ``External id`` an operator to
    ``record_param_comms``; the collective keys come from ``torch/csrc/profiler/util.cpp``;
    ``Input Dims`` / ``Input type`` size gloo annotations; ``name`` labels ``thread_name``
    metadata events.
    """

    correlation: Any = None
    external_id: Any = msgspec.field(name="External id", default=None)
    collective_name: Any = msgspec.field(name="Collective name", default=None)
    in_msg_nelems: Any = msgspec.field(name="In msg nelems", default=None)
    out_msg_nelems: Any = msgspec.field(name="Out msg nelems", default=None)
    dtype: Any = None
    group_size: Any = msgspec.field(name="Group size", default=None)
    pg_name: Any = msgspec.field(name="Process Group Name", default=None)
    pg_desc: Any = msgspec.field(name="Process Group Description", default=None)
    pg_ranks: Any = msgspec.field(name="Process Group Ranks", default=None)
    global_rank_start: Any = msgspec.field(name="Global rank start", default=None)
    global_rank_stride: Any = msgspec.field(name="Global rank stride", default=None)
    # The sequence number of the op in its group; the send/recv of one batched p2p share it.
    seq: Any = msgspec.field(name="Seq", default=None)
    input_dims: Any = msgspec.field(name="Input Dims", default=None)
    input_type: Any = msgspec.field(name="Input type", default=None)
    name: Any = None


class TraceEvent(msgspec.Struct, frozen=True, gc=False):
    """One ``traceEvents`` entry: timestamps in trace microseconds.

    ``ts`` / ``dur`` are typed float for the hot loops but are None when the key is absent
    (metadata, flow and instant events lack them): a complete event without them fails the
    first arithmetic on it, which `analyze_trace` reports as a malformed trace event.
    """

    cat: str | None = None
    ph: str | None = None
    name: str = ""
    pid: int | str | None = None
    tid: int | str | None = None
    ts: float = None  # type: ignore[assignment]  # absent: None (see the class docstring)
    dur: float = None  # type: ignore[assignment]
    args: EventArgs | None = None


class KinetoTrace(msgspec.Struct, frozen=True, gc=False):
    """A decoded Kineto chrome trace: its events plus the top-level keys the engine reads."""

    events: Sequence[TraceEvent] = msgspec.field(name="traceEvents")
    distributed_info: Any = msgspec.field(name="distributedInfo", default=None)
    device_properties: Any = msgspec.field(name="deviceProperties", default=None)
    base_time_ns: Any = msgspec.field(name="baseTimeNanoseconds", default=None)
    # Set by `read_trace` to the `_columns.DeviceColumns` its selection read; used only when
    # it is one (a JSON document can hold no such object).
    columns: Any = msgspec.field(name="mfuscope:columns", default=None)
    # What the mfuscope agent adds to the traces it keeps (`_gloo.trace_worker_groups`).
    mfuscope: Any = msgspec.field(name="mfuscope", default=None)


# The categories Kineto writes (libkineto ActivityType names, flow-event and PyTorch 1.8-era
# names) and the phases of the Trace Event Format. Decoded as Literals, these values come out
# as the same interned string objects instead of a fresh string per event: less memory, and
# the category lookup in `_scan` hashes nothing (figures: benchmarks/RESULTS.md#reading). A
# trace with any other value is decoded again with plain strings (`TraceEvent`), so an unknown
# category costs time, never correctness.
_Category = Literal[
    "cpu_op",
    "user_annotation",
    "gpu_user_annotation",
    "gpu_memcpy",
    "gpu_memset",
    "kernel",
    "external_correlation",
    "cuda_runtime",
    "cuda_driver",
    "cuda_profiler_range",
    "cuda_sync",
    "glow_runtime",
    "cpu_instant_event",
    "python_function",
    "overhead",
    "collective_comm",
    "mtia_runtime",
    "mtia_ccp_events",
    "mtia_insight",
    "hpu_op",
    "xpu_runtime",
    "xpu_driver",
    "privateuse1_runtime",
    "privateuse1_driver",
    "ac2g",
    "fwdbwd",
    "async_cpu_to_gpu",
    "Trace",
    "Kernel",
    "Memcpy",
    "Memset",
    "Runtime",
    "Operator",
]
_Phase = Literal[
    "B", "E", "X", "i", "I", "C", "b", "n", "e", "S", "T", "p", "F", "s", "t", "f", "P",
    "O", "N", "D", "M", "V", "v", "R", "c", "(", ")",
]  # fmt: skip


class _KnownEventBody(msgspec.Struct, frozen=True, gc=False):
    """`TraceEvent` without ``ph`` (the phase classes below carry it as their tag)."""

    cat: _Category | None = None
    name: str = ""
    pid: int | str | None = None
    tid: int | str | None = None
    ts: float = None  # type: ignore[assignment]  # absent: None (see TraceEvent)
    dur: float = None  # type: ignore[assignment]
    args: EventArgs | None = None


class _KnownFlowBody(msgspec.Struct, frozen=True, gc=False):
    """A flow event (``ph`` s/t/f: the arrows linking a launch to its kernel): only ``cat``.

    The engine links launches to kernels by ``args.correlation`` and never reads a flow event
    past its category, yet Kineto writes one or two per launch (13-34% of the events of the
    real traces, a third of the generated one): decoded into this, such an event's other keys
    are skipped, not built (figures: benchmarks/RESULTS.md#reading). Their other fields read as
    `TraceEvent`'s defaults, so they are not type-checked either: a flow event with, e.g., a
    string ``ts`` is no longer an error.
    """

    cat: _Category | None = None
    name = ""
    pid = None
    tid = None
    ts = None
    dur = None
    args = None


_FLOW_PHASES = frozenset({"s", "t", "f"})


def _phase_class(phase: str) -> type[msgspec.Struct]:
    """The fast decoder's event type for one phase: a union tagged by ``ph`` picks it by value.

    Named ``TraceEvent`` so that reprs and messages read as with the plain model; ``ph`` is a
    class attribute (the tag is no field), so ``event.ph`` reads the same on both models.
    """
    body = _KnownFlowBody if phase in _FLOW_PHASES else _KnownEventBody
    namespace = {"ph": phase, "__module__": __name__}
    return msgspec.defstruct(
        "TraceEvent", [], bases=(body,), tag_field="ph", tag=phase, frozen=True, gc=False,
        namespace=namespace,
    )  # fmt: skip


# Any other phase (or an event without ``ph``) fails the union: then plain `TraceEvent`s.
_KnownEvent: Any = functools.reduce(operator.or_, map(_phase_class, get_args(_Phase)))
_KnownKinetoTrace = msgspec.defstruct(
    "KinetoTrace",
    [("events", Sequence[_KnownEvent], msgspec.field(name="traceEvents"))],
    bases=(KinetoTrace,),
    frozen=True,
    gc=False,
    namespace={"__module__": __name__},
)
_FAST_DECODER: msgspec.json.Decoder[Any] = msgspec.json.Decoder(_KnownKinetoTrace)


@functools.cache
def _plain_decoder() -> msgspec.json.Decoder[KinetoTrace]:
    """The decoder into plain `TraceEvent`s, made on first use (few traces need it)."""
    return msgspec.json.Decoder(KinetoTrace)


def decode_kineto(raw: bytes) -> KinetoTrace:
    """Decode JSON text into a `KinetoTrace`; raises `msgspec.DecodeError` (invalid JSON) or
    its subclass `msgspec.ValidationError` (valid JSON that does not fit the model)."""
    try:  # an instance of a KinetoTrace subclass, its events duck-typed `TraceEvent`s
        return cast(KinetoTrace, _FAST_DECODER.decode(raw))
    except msgspec.ValidationError:  # e.g. a category we do not know: plain strings then
        return _plain_decoder().decode(raw)


def describe_validation_error(exc: msgspec.ValidationError) -> str:
    """Our wording for a JSON document that does not fit the model (msgspec names the path)."""
    if "$.traceEvents[" in str(exc):
        return f"malformed trace event ({exc})"
    return f"not a Kineto trace: {exc}"


def as_kineto_trace(trace: Mapping[str, Any] | KinetoTrace) -> KinetoTrace:
    """`trace` itself if already decoded, else the decoded-dict form converted (in C).

    Raises `TraceError(None, ...)` when the dict is not a Kineto trace or an event has a value
    of the wrong type (e.g. a string timestamp).
    """
    if isinstance(trace, KinetoTrace):
        return trace
    if not isinstance(trace, Mapping):
        raise TraceError(None, "not a Kineto trace: the top level is not a JSON object")
    if not isinstance(trace.get("traceEvents"), list):
        raise TraceError(None, "not a Kineto trace: no traceEvents list")
    try:
        return msgspec.convert(trace if isinstance(trace, dict) else dict(trace), KinetoTrace)
    except msgspec.ValidationError as exc:
        raise TraceError(None, describe_validation_error(exc)) from None
