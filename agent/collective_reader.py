"""Always-on collective records: the flight recorder, read on the agent's periodic thread.

Every `interval_s` (shorter when ops arrive fast enough to fill a quarter of the ring in that
time) the periodic thread (`_periodic`) dumps each recorder (`flight_recorder.dump_sources`),
takes the entries that completed since the last dump (`core.flight_records.RecordTracker`) and
adds them up (`core.flight_accounting`): traffic per (op, axis, tier, group size), progress per
process group, an arrival sample per group and step and, where the backend times ops (NCCL with
timing on), each step's collective seconds per (op, axis, tier), which the step reports take
(`step_durations`) for the steps between profiled windows. The step starts come from the agent's
step reports (`step_began`, from the start times the training thread notes in its step
recorder); before each read the reader asks for the latest ones (`follow_steps`). The training
thread calls nothing here; the transport thread calls `records` when it encodes a batch.

What the counters cover: the ops enqueued after the agent started (its first dump is a baseline),
that completed. Entries the ring overwrites before a dump sees them done are counted as lost.
"""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace

from mfuscope.agent._fr_json import entries_from
from mfuscope.agent._health import RateLimitedLog
from mfuscope.agent._periodic import Periodic, Task, adaptive_interval_s
from mfuscope.agent._topology import RankTopology, group_names
from mfuscope.agent.config import AgentConfig
from mfuscope.agent.flight_recorder import (
    DEFAULT_BUFFER_SIZE,
    DumpSource,
    dump_sources,
    enable_nccl_timing,
    nccl_group_count,
    ring_entries,
)
from mfuscope.core.collective_records import CommRecords
from mfuscope.core.flight_accounting import (
    ArrivalSampler,
    GroupNames,
    ProgressTracker,
    StepDurations,
    StepDurationsUpdate,
    TrafficTotals,
)
from mfuscope.core.flight_records import (
    FlightEntry,
    RecordTracker,
    entry_from_dump,
    entry_from_raw,
)

__all__ = ["CollectiveReader", "build_collective_reader"]

# The shortest pause between two dumps (s): at very high op rates the ring still wraps faster,
# and the overwritten entries are counted as lost rather than the reader spinning.
MIN_INTERVAL_S = 0.05
# Dump again before this share of the ring can have been replaced.
RING_SHARE = 0.25
# The pause of a paused reader's task (`resume` wakes it sooner).
_PAUSED_S = 3600.0
# Entries accounted between two offers of the GIL to the training thread.
ACCOUNT_CHUNK = 256


class CollectiveReader:
    """Reads `sources` on a periodic thread and keeps the rank's collective records."""

    def __init__(
        self,
        sources: Sequence[DumpSource],
        names: GroupNames,
        *,
        log: RateLimitedLog,
        durations: bool = False,
        p2p_recorded: bool = False,
        interval_s: float = 5.0,
        status_interval_s: float = 10.0,
        ring_entries: int = DEFAULT_BUFFER_SIZE,
        clock: Callable[[], float] = time.monotonic,
        wall_clock_ns: Callable[[], int] = time.time_ns,
        groups: Sequence[tuple[str, str]] = (),
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        """`groups`: (name, description) of the process groups this rank belongs to, reported
        from the start (entered 0) so a rank stuck before its first collective on one is
        named (`core.flight_accounting.ProgressTracker`)."""
        self._sources = list(sources)
        self._names = names
        self._log = log
        self.durations = durations
        self._p2p_recorded = p2p_recorded
        self._interval_s = interval_s
        self._status_interval_s = status_interval_s
        self._ring_entries = max(ring_entries, 1)
        self._clock = clock
        self._wall_clock_ns = wall_clock_ns
        self._sleep = sleep  # between close's last reads (tests script it with `clock`)
        self._trackers = {s.name: RecordTracker() for s in self._sources}
        self._traffic = TrafficTotals()
        self._progress = ProgressTracker(groups)
        self._arrivals = ArrivalSampler()
        self._step_seconds = StepDurations()
        self._steps: collections.deque[tuple[int, int]] = collections.deque(maxlen=4096)
        self._latest_steps: Callable[[], object] | None = None  # see `follow_steps`
        self._lock = threading.Lock()
        self._cursors: dict[str, int] = {}  # sink -> arrival samples it has had
        self._lost = 0
        self._paused = False
        self._missed = False  # a read came due while paused
        self._closed = False
        self._periodic: Periodic | None = None
        self._task: Task | None = None
        self._last_read_s = 0.0  # when the reader last read (clock s; 0: never)
        self.open_entries = 0  # ops enqueued and not done at the latest read
        self.reads = 0
        self.cpu_s = 0.0  # CPU time spent reading (s)
        self.taken = 0  # entries taken (done) since the baseline
        # The longest stretch of the reader's own Python work without offering the GIL (s): an
        # upper bound of what it can keep the training thread waiting for the GIL (the OS may
        # still preempt it mid-stretch on a busy machine).
        self.longest_hold_s = 0.0

    # --- step starts (the agent's periodic thread) ----------------------------------------------

    def step_began(self, step: int, start_unix_ns: int | None = None) -> None:
        """Mark the start of `step` (ns since the epoch, the recorder's clock; None: now)."""
        start = self._wall_clock_ns() if start_unix_ns is None else start_unix_ns
        self._steps.append((step, start))

    def follow_steps(self, latest_steps: Callable[[], object]) -> None:
        """Call `latest_steps` before each read: it hands the reader (`step_began`) the starts of
        the steps begun so far."""
        self._latest_steps = latest_steps

    # --- set-up and shutdown ------------------------------------------------------------------

    def baseline(self) -> int:
        """Dump once and mark what is there as seen (the ops before the agent started): they
        count in no traffic, but the rank's progress on each group starts from them. Drops a
        source that returns the very entries of an earlier one (one ring behind two bindings).
        Returns how many entries the sources hold."""
        seen: set[tuple[int, int]] = set()
        kept = []
        total = 0
        for source in self._sources:
            entries = self._dump(source, -1)
            # Entries of two rings never share a record id *and* an enqueue time to the ns.
            identity = {(e.record_id, e.created_unix_ns) for e in entries}
            if identity & seen:
                continue
            seen |= identity
            kept.append(source)
            self._trackers[source.name].baseline(entries)
            with self._lock:
                self._progress.observe(
                    [e for e in entries if e.done and not e.is_p2p],
                    [e for e in entries if not e.done and not e.is_p2p],
                )
            total += len(entries)
        self._sources = kept
        return total

    def start(self, periodic: Periodic) -> None:
        """Read every `interval_s` on `periodic`'s thread (the agent's; its owner stops it)."""
        self._periodic = periodic
        self._task = self._periodic.add("collectives", self.tick, delay_s=self._interval_s)

    def pause(self) -> None:
        """Stop reading until `resume` (benchmarks comparing agents in one process use it)."""
        self._paused = True

    def resume(self) -> None:
        """Read again; at once if a read came due while paused."""
        self._paused = False
        if self._missed and self._periodic is not None and self._task is not None:
            self._missed = False
            self._periodic.wake(self._task)
        self._closed = False

    def close(self, timeout_s: float = 1.0) -> None:
        """No more periodic reads; then, on this thread, a last read that waits, within
        `timeout_s`, for the ops still open to complete (a backend marks an op done a moment
        after the caller's wait returns)."""
        if self._closed:
            return
        self._closed = True
        deadline = self._clock() + max(timeout_s * 0.8, 0.0)
        if self._periodic is not None and self._task is not None:
            self._periodic.remove(self._task, timeout_s)
        self._read_guarded()
        while self.open_entries and self._clock() < deadline:
            self._sleep(0.02)
            self._read_guarded()
        if self.durations and not self.open_entries:  # no step begins any more: all whole
            with self._lock:
                self._step_seconds.complete_all(list(self._steps))

    # --- reading (periodic thread; at close the closing thread) -------------------------------

    def tick(self) -> float:
        """Read (unless paused: then at `resume`); the pause before the next read (s)."""
        if self._paused:
            self._missed = True
            return _PAUSED_S
        return self._read_guarded()

    def _read_guarded(self) -> float:
        """Read once; the pause before the next read (s), from the rate at which entries came
        since the previous read (those taken and those overwritten unread)."""
        try:
            lost_before = self._lost
            taken = self.read_once()
            now = self._clock()
            since = max(now - self._last_read_s, 1e-3) if self._last_read_s else 0.0
            self._last_read_s = now
        except Exception as exc:  # telemetry never stops on a surprise; it says so
            self._log.warning(
                "collective-read", "mfuscope: reading the flight recorder failed: %r", exc
            )
            return self._interval_s
        return adaptive_interval_s(
            taken + self._lost - lost_before,
            since,
            self._ring_entries,
            max_s=self._interval_s,
            min_s=MIN_INTERVAL_S,
            share=RING_SHARE,
        )

    def read_once(self) -> int:
        """Dump every source and take what completed; returns the entries taken."""
        cpu_start = time.thread_time()
        dumped_ns = self._wall_clock_ns()  # every op enqueued before this is in the dumps
        done: list[FlightEntry] = []
        still_open: list[FlightEntry] = []
        lost = 0
        for source in self._sources:
            tracker = self._trackers[source.name]
            update = tracker.update(self._dump(source, tracker.next_id))
            done.extend(update.done)
            still_open.extend(update.open)
            lost += update.lost
        if self._latest_steps is not None:
            self._latest_steps()  # every step begun before this dump, at least
        steps = list(self._steps)
        # Durations appear where the backend times ops (NCCL with timing on).
        timed = self.durations or any(e.duration_s is not None for e in done)
        for start in range(0, len(done), ACCOUNT_CHUNK):  # GIL offered between chunks
            part = done[start : start + ACCOUNT_CHUNK]
            held_from = time.perf_counter()
            with self._lock:
                self._traffic.add(part, self._names)
                self._arrivals.observe(part, steps)
                if timed:
                    self._step_seconds.add(part, steps, self._names)
            self._held(time.perf_counter() - held_from)
            time.sleep(0)
        held_from = time.perf_counter()
        with self._lock:
            self._progress.observe(done, still_open)
            self._lost += lost
            if timed:
                self._step_seconds.advance(still_open, steps, dumped_ns, lost)
            self.durations = timed
            self.reads += 1
            self.taken += len(done)
            self.open_entries = len(still_open)
        self._held(time.perf_counter() - held_from)
        if lost:
            self._log.warning(
                "collective-lost",
                "mfuscope: %d flight-recorder entries were overwritten before the agent read "
                "them; raise TORCH_FR_BUFFER_SIZE (entries) if this repeats",
                lost,
            )
        self.cpu_s += time.thread_time() - cpu_start
        return len(done)

    def _dump(self, source: DumpSource, from_record_id: int) -> list[FlightEntry]:
        raw = source.dump()
        if source.json:
            entries: list[FlightEntry] = []
            held_from = time.perf_counter()
            for chunk in entries_from(raw, max(from_record_id, 0)):
                entries.extend(entry_from_raw(item) for item in chunk)
                self._held(time.perf_counter() - held_from)
                time.sleep(0)  # let the training thread take the GIL between chunks
                held_from = time.perf_counter()
            return entries
        decoded = raw.get("entries", ()) if isinstance(raw, Mapping) else ()
        # Only what the tracker has not taken yet (it would skip the older ones), unless the ids
        # went back (a recorder reset: the tracker must see them to start again).
        ids = [_record_id(e) for e in decoded]
        cut = from_record_id if ids and max(ids) >= from_record_id else -1
        fresh = [e for e, i in zip(decoded, ids, strict=True) if i >= cut]
        found: list[FlightEntry] = []
        for start in range(0, len(fresh), ACCOUNT_CHUNK):
            held_from = time.perf_counter()
            found.extend(e for e in map(entry_from_dump, fresh[start : start + ACCOUNT_CHUNK]) if e)
            self._held(time.perf_counter() - held_from)
            time.sleep(0)
        return found

    def _held(self, seconds: float) -> None:
        """Note a stretch of Python work between two offers of the GIL (benchmarks read it)."""
        self.longest_hold_s = max(self.longest_hold_s, seconds)

    # --- what the step reports take (the periodic thread; at close the closing thread) --------

    def step_durations(self) -> StepDurationsUpdate:
        """The steps whose collectives are all in since the last call, with their seconds per
        (op, axis, tier) (`StepDurations`); `timed` whether this rank's ops have durations."""
        with self._lock:
            update = self._step_seconds.take()
            return replace(update, timed=update.timed or self.durations)

    # --- what the batches carry (transport thread) ------------------------------------------

    def records(self, reader: str = "") -> CommRecords:
        """This rank's records now: cumulative traffic, group progress, and the arrival samples
        `reader` (a sink) has not had yet."""
        now = self._wall_clock_ns()
        with self._lock:
            arrivals, self._cursors[reader] = self._arrivals.since(self._cursors.get(reader, 0))
            return CommRecords(
                source="flight_recorder",
                durations=self.durations,
                status_interval_s=self._status_interval_s,
                lost_total=self._lost,
                p2p_recorded=self._p2p_recorded,
                traffic=self._traffic.records(),
                groups=self._progress.records(self._names, now),
                arrivals=arrivals,
            )


def _record_id(item: object) -> int:
    record_id = item.get("record_id") if isinstance(item, Mapping) else None
    return record_id if isinstance(record_id, int) else -1


def build_collective_reader(
    config: AgentConfig,
    topology: RankTopology,
    log: RateLimitedLog,
    given: Sequence[DumpSource] | None = None,
) -> CollectiveReader | None:
    """The reader of the flight recorder (docs/agent.md, "Collective records"); None when off,
    outside torch.distributed, or when the recorder records nothing. `given`: test sources."""
    if not config.collective_records:
        return None
    try:
        if given is not None:
            sources, durations, nccl = list(given), False, False
        else:
            import torch.distributed as dist

            if not (dist.is_available() and dist.is_initialized()):
                return None
            sources = dump_sources()
            nccl = nccl_group_count() > 0
            durations = bool(nccl and config.collective_timing and enable_nccl_timing())
        reader = CollectiveReader(
            sources,
            group_names(topology),
            log=log,
            durations=durations,
            # ProcessGroupNCCL records send/recv; ProcessGroupGloo does not (torch 2.13).
            p2p_recorded=nccl,
            interval_s=config.collective_read_interval_s,
            status_interval_s=config.status_interval_s,
            ring_entries=ring_entries(),
            groups=[(g.name, g.desc) for g in topology.groups if len(g.ranks) > 1],
        )
        # The start-up gather of `discover_topology` is a collective: an empty ring means the
        # recorder is off (TORCH_FR_BUFFER_SIZE=0, or set too late on an older torch).
        if not sources or reader.baseline() == 0:
            log.warning(
                "flight-recorder-off",
                "mfuscope: PyTorch's flight recorder records nothing in this process; collective "
                "counts come from profiled windows only (set TORCH_FR_BUFFER_SIZE=2000 before "
                "init_process_group, or import mfuscope.agent before it)",
            )
            return None
        return reader
    except Exception as exc:  # a private torch API: a surprise leaves the records off
        log.warning("flight-recorder", "mfuscope: collective records unavailable: %r", exc)
        return None
