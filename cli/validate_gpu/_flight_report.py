"""What validate-gpu's flight-recorder probe found (`_flight`), and its checks. Pure: no torch.

Four questions a GPU run answers about the agent's always-on collective records on NCCL: does the
agent's native dump (ctypes into libtorch, without the GIL) give exactly what PyTorch's binding
gives, on a ring with entries; with timing on, does every completed collective carry a duration,
and do the all_reduces' durations equal their CUDA-event timing (events around each call on
the caller's stream); are calls and bytes per op those the probe issued; and is a stalled rank
named by the hang join (`core.hangs`) from the ranks' own progress reports.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

__all__ = [
    "DURATION_TOLERANCE",
    "DumpComparison",
    "FlightProbe",
    "OpTraffic",
    "StallProbe",
    "flight_checks",
]

# The all_reduces' recorded durations against the CUDA events around each call: equal within
# this share. The recorder's events sit inside ours (on NCCL's stream, after it waited for the
# caller's; ours on the caller's, the end after the caller waited for NCCL's).
DURATION_TOLERANCE = 0.10


@dataclass(frozen=True)
class DumpComparison:
    """One recorder's native dump against its binding's, taken back to back on a quiet ring.
    `difference`: the first place they differ ("" when equal)."""

    source: str
    entries: int
    equal: bool
    difference: str = ""


@dataclass(frozen=True)
class OpTraffic:
    """One op's counted calls and bytes (the agent's records) against what the probe issued;
    `seconds`: the recorded durations added up."""

    op: str
    calls: int
    bytes: int
    seconds: float
    expected_calls: int
    expected_bytes: int


@dataclass(frozen=True)
class StallProbe:
    """A deliberate stall and what the hang join made of it. `mode`: ``peer`` (rank 1 of two
    processes sleeps before collective `seq`, rank 0 waits in it) or ``device`` (one process: its
    device is kept busy, so its collective `seq` stays open). `suspects`: the ranks named;
    `blocked_ops`: the ops ranks were found blocked in; `waited_s`: the longest wait seen."""

    mode: str
    stalled_rank: int
    seq: int
    suspects: tuple[int, ...]
    suspect_seqs: tuple[int, ...]
    blocked_ops: tuple[str, ...]
    waited_s: float


@dataclass(frozen=True)
class FlightProbe:
    """`native`: the agent dumps at least one recorder natively. `timed` of `done`: completed
    entries of the probe's ops that carry a duration; `all_reduce_event_s`: the all_reduces'
    CUDA-event times added up (events around each call). `skipped`: why the probe did not run
    (then nothing else)."""

    world_size: int
    native: bool
    dumps: tuple[DumpComparison, ...]
    timed: int
    done: int
    all_reduce_event_s: float
    traffic: tuple[OpTraffic, ...]
    stall: StallProbe | None
    skipped: str = ""


@dataclass(frozen=True)
class FlightCheck:
    name: str
    ok: bool
    measured: str
    expected: str


NAMES = (
    "flight recorder: native dump = binding",
    "flight recorder: NCCL durations",
    "flight recorder: calls and bytes per op",
    "flight recorder: stalled rank named",
)


def _dump_check(f: FlightProbe) -> FlightCheck:
    native = [d for d in f.dumps if d.entries > 0]
    ok = f.native and bool(native) and all(d.equal for d in f.dumps)
    measured = "; ".join(
        f"{d.source}: {d.entries} entries, {'equal' if d.equal else 'differ at ' + d.difference}"
        for d in f.dumps
    ) or ("no native dump (the agent uses the pickle binding)" if not f.native else "none")
    return FlightCheck(NAMES[0], ok, measured, "every native dump equal to its binding's, entries")


def _duration_check(f: FlightProbe) -> FlightCheck:
    reduce_s = sum(t.seconds for t in f.traffic if t.op == "all_reduce")
    events_s = f.all_reduce_event_s
    ratio = reduce_s / events_s if events_s > 0 else float("inf")
    ok = f.done > 0 and f.timed == f.done and abs(ratio - 1) <= DURATION_TOLERANCE
    return FlightCheck(
        NAMES[1],
        ok,
        f"{f.timed} of {f.done} done entries timed; all_reduce durations {reduce_s * 1e3:.3f} ms "
        f"/ CUDA events {events_s * 1e3:.3f} ms = {ratio:.3f}",
        f"every done entry timed; durations = event time +- {DURATION_TOLERANCE:.0%}",
    )


def _traffic_check(f: FlightProbe) -> FlightCheck:
    ok = bool(f.traffic) and all(
        t.calls == t.expected_calls and t.bytes == t.expected_bytes for t in f.traffic
    )
    measured = ", ".join(
        f"{t.op} {t.calls}/{t.expected_calls} calls {t.bytes}/{t.expected_bytes} B"
        for t in f.traffic
    )
    return FlightCheck(NAMES[2], ok, measured or "none", "counted = issued, per op")


def _stall_check(f: FlightProbe) -> FlightCheck:
    s = f.stall
    if s is None:
        return FlightCheck(NAMES[3], False, "no stall run", "")
    if s.mode == "peer":
        ok = s.suspects == (s.stalled_rank,) and s.suspect_seqs == (s.seq,)
        expected = f"rank {s.stalled_rank} named for collective {s.seq}, no other"
    else:  # one process: nobody else to blame; the rank itself is found blocked there
        ok = s.suspects == () and s.blocked_ops == ("all_reduce",)
        expected = f"rank {s.stalled_rank} blocked in all_reduce {s.seq}, no suspect"
    measured = (
        f"{s.mode}: suspects {list(s.suspects)} at {list(s.suspect_seqs)}, blocked in "
        f"{list(s.blocked_ops)}, waited {s.waited_s:.1f} s"
    )
    return FlightCheck(NAMES[3], ok, measured, expected)


def flight_checks(f: FlightProbe | None, errors: Mapping[str, str]) -> list[FlightCheck]:
    """The four checks (failed, with the reason, when the probe failed or was skipped)."""
    if f is None or f.skipped:
        why = f.skipped if f is not None else errors.get("flight recorder", "not run")
        return [FlightCheck(name, False, why, "") for name in NAMES]
    return [_dump_check(f), _duration_check(f), _traffic_check(f), _stall_check(f)]
