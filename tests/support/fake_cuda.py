"""The CUDA boundary of the agent's step timer, faked: events a fake device passes in order,
streams, and every synchronisation asked for (none should be).

`FakeDevice.calls()` gives the `DeviceCalls` the agent's step recorder makes at a step boundary
(`record(event, stream)`, `raw_stream()`, `stream()`, `new_event()`), so the device path runs
on CPU: the recorder's hot path, the timer's polls on the periodic thread, and close.
"""

from __future__ import annotations

from mfuscope.agent.step_timer import DeviceCalls

__all__ = ["FakeDevice", "FakeEvent", "FakeStream"]


class FakeStream:
    """A stream object as `torch.cuda.current_stream()` builds one: a new object per call."""

    def __init__(self, handle: int) -> None:
        self.handle = handle


class FakeEvent:
    """Stands in for torch.cuda.Event: `done` is set by the fake device; recording again makes
    it pending again, as on CUDA."""

    def __init__(self, device: FakeDevice) -> None:
        self.device = device
        self.time_ms: float | None = None
        self.done = False
        self.stream: int | None = None  # the handle of the stream it was last recorded on

    def query(self) -> bool:
        self.device.queries += 1
        return self.done

    def elapsed_time(self, end_event: FakeEvent) -> float:
        # A real event raises here when not completed; the timer must never ask.
        assert self.done and end_event.done, "elapsed_time on an event the device has not passed"
        assert self.time_ms is not None and end_event.time_ms is not None
        return end_event.time_ms - self.time_ms

    def synchronize(self) -> None:
        self.device.syncs += 1
        self.device.run_all()


class FakeDevice:
    """The CUDA boundary: events it creates, records and passes in order, the stream objects
    built, and the synchronisations asked."""

    def __init__(self) -> None:
        self.pending: list[FakeEvent] = []
        self.created = 0
        self.records = 0
        self.queries = 0
        self.syncs = 0
        self.streams_built = 0
        self.clock_ms = 0.0
        self.current = 0  # the current stream's handle (0: the default stream)
        self.fail_records = False

    def new_event(self) -> FakeEvent:
        self.created += 1
        return FakeEvent(self)

    def record(self, event: FakeEvent, stream: FakeStream) -> None:
        if self.fail_records:
            raise RuntimeError("CUDA error: an illegal memory access was encountered")
        assert isinstance(stream, FakeStream)
        self.records += 1
        event.done, event.time_ms, event.stream = False, None, stream.handle
        if event in self.pending:
            self.pending.remove(event)
        self.pending.append(event)

    def raw_stream(self) -> int:
        return self.current

    def stream(self) -> FakeStream:
        self.streams_built += 1
        return FakeStream(self.current)

    def calls(self) -> DeviceCalls:
        return DeviceCalls(self.new_event, self.record, self.raw_stream, self.stream)

    def run(self, count: int, each_ms: float) -> None:
        """The device passes the next `count` recorded events, `each_ms` apart."""
        for event in self.pending[:count]:
            self.clock_ms += each_ms
            event.time_ms = self.clock_ms
            event.done = True
        del self.pending[:count]

    def run_all(self, each_ms: float = 1.0) -> None:
        self.run(len(self.pending), each_ms)
