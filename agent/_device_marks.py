"""The step recorder's device boundary off its hot path (GPU timelines only).

The recorder (`_step_recorder`) records one CUDA event per step boundary, inline on its hot
path: at a step's start an event popped from the timer's pool (`DeviceEventStepTimer.pool`, which
the periodic thread refills with spent events; a new one when it is empty) into the ring of
events beside the ring of starts, at a `with` step's end one reused event (`end_event`) on the
stream of the step's start. Each record goes through the C binding on a stream object fetched
once (`record_event(event, stream)`); at each start the current stream's handle (`raw_stream()`,
an int: 0 on the default stream, a cached small int) is compared with the held one's, and the
stream is fetched again only when they differ (`stream_changed`: this builds a `Stream`). The
record releases the GIL while the driver enqueues the event (as the CPU path's `os.pread` does).

Here: setting that up, the slow path's copies of the inlined records, and the rare cases.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from mfuscope.agent._step_recorder import StepRecorder
    from mfuscope.agent.step_timer import DeviceEventStepTimer

__all__ = ["attach_device", "device_end", "device_failed", "device_start", "stream_changed"]


def attach_device(recorder: StepRecorder, timer: DeviceEventStepTimer) -> None:
    """Give `recorder` the timer's CUDA calls and pool; the timer reads the recorder's rings."""
    calls = timer.calls
    recorder.new_event, recorder.record_event = calls.new_event, calls.record
    recorder.raw_stream, recorder.current_stream = calls.raw_stream, calls.stream
    recorder.event_pool = timer.pool
    recorder.end_event = calls.new_event()  # a CUDA event is created at its first record
    timer.attach(recorder)


def device_start(recorder: StepRecorder, n: int) -> None:
    """The start event of the step in ring slot n (the slow path's copy of the inlined one)."""
    try:
        pool = recorder.event_pool
        event = recorder.events[n % len(recorder.events)] = (
            pool.pop() if pool else recorder.new_event()
        )
        if (handle := recorder.raw_stream()) != recorder.stream_handle:
            stream_changed(recorder, handle)
        recorder.record_event(event, recorder.stream)
    except Exception as exc:
        device_failed(recorder, n, exc)


def device_end(recorder: StepRecorder) -> None:
    """The end event of the latest step (the slow path's copy of the inlined one), on the stream
    its start was recorded on: the step is timed on one stream, and only the last step's end is
    ever read (a stream switched inside a step is seen at the next start)."""
    try:
        recorder.record_event(recorder.end_event, recorder.stream)
    except Exception as exc:
        recorder.internal_error("timer", exc)


def stream_changed(recorder: StepRecorder, handle: int) -> None:
    """The current stream is not the one events were recorded on (the first boundary, or the
    job switched streams): fetch it (this builds a Stream object, once per change)."""
    recorder.stream = recorder.current_stream()
    recorder.stream_handle = handle


def device_failed(recorder: StepRecorder, n: int, exc: BaseException) -> None:
    """A step start whose event could not be recorded: its slot is empty (the timer drops the
    step and the one before), the failure counted."""
    recorder.events[n % len(recorder.events)] = None
    recorder.internal_error("timer", exc)
