"""Transport: bounded buffer, batching, retries with backoff, close with timeout; the sinks."""

from __future__ import annotations

import contextlib
import json
import logging
import socket
import threading
import time
from collections.abc import Sequence
from pathlib import Path

import pytest
from mfuscope.agent import _sinks as sinks
from mfuscope.agent._health import HealthCounters, RateLimitedLog
from mfuscope.agent._sinks import HttpSink, JsonlSink, SendError
from mfuscope.agent._transport import RetryPolicy, Transport, backoff_delay_s
from mfuscope.core.schema import StepReport

from tests.support import agent_helpers as helpers
from tests.support.collector_fakes import batch_dict
from tests.support.waiting import wait_until


def _report(step: int) -> StepReport:
    return StepReport(step=step, start_unix_ns=1, wall_s=0.1, model_flops=1e9, recompute_flops=0.0)


def _encode(reports: Sequence[StepReport]) -> bytes:
    return json.dumps([r.step for r in reports]).encode()


class FakeSink:
    """Records delivered step lists; `failures` scripts errors for the next calls."""

    def __init__(self, failures: Sequence[SendError] = (), gate: threading.Event | None = None):
        self.delivered: list[list[int]] = []
        self.calls = 0
        self.failures = list(failures)
        self.gate = gate
        self.closed = False
        self.sending = False  # inside `send` now

    def describe(self) -> str:
        return "fake"

    def send(self, body: bytes, timeout_s: float) -> None:
        self.calls += 1
        if self.gate is not None:
            self.sending = True
            self.gate.wait(timeout_s)
            self.sending = False
            if not self.gate.is_set():
                raise SendError("timed out", retryable=True)
        if self.failures:
            raise self.failures.pop(0)
        self.delivered.append(json.loads(body))

    def close(self) -> None:
        self.closed = True


class ListHandler(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


def _transport(
    sink: FakeSink,
    health: HealthCounters,
    *,
    log: RateLimitedLog | None = None,
    retry: RetryPolicy | None = None,
    **kwargs: object,
) -> Transport:
    options: dict[str, object] = {"flush_interval_s": 60.0, "max_batch_reports": 4}
    options.update(kwargs)
    return Transport(
        sink,
        _encode,
        health,
        log or RateLimitedLog(60.0),
        retry=retry or RetryPolicy(max_attempts=3, base_s=0.001, max_s=0.002),
        **options,  # type: ignore[arg-type]
    )


def test_delivers_everything_in_order_in_bounded_batches() -> None:
    sink, health = FakeSink(), HealthCounters()
    transport = _transport(sink, health)
    for step in range(10):
        transport.submit(_report(step))
    assert transport.close(5.0) is True
    assert [s for batch in sink.delivered for s in batch] == list(range(10))
    assert max(len(batch) for batch in sink.delivered) <= 4
    assert health.snapshot().reports_dropped_total == 0
    assert sink.closed


def test_flush_interval_sends_a_partial_batch_without_close() -> None:
    sink, health = FakeSink(), HealthCounters()
    transport = _transport(sink, health, flush_interval_s=0.02, max_batch_reports=100)
    transport.submit(_report(1))
    wait_until(lambda: sink.delivered == [[1]], "sink.delivered == [[1]]")
    transport.close(1.0)


def test_full_buffer_drops_oldest_and_counts() -> None:
    gate = threading.Event()
    sink, health = FakeSink(gate=gate), HealthCounters()
    transport = _transport(sink, health, max_queue_reports=5, max_batch_reports=1)
    transport.submit(_report(0))
    wait_until(
        lambda: sink.calls == 1, "sink.calls == 1"
    )  # report 0 is in flight, blocked on the gate
    for step in range(1, 11):
        transport.submit(_report(step))
    # The report in flight counts against the buffer; while it is on the wire the oldest queued
    # reports go.
    assert health.snapshot().reports_dropped_total == 6
    gate.set()
    assert transport.close(5.0) is True
    assert [s for batch in sink.delivered for s in batch] == [0, 7, 8, 9, 10]


def test_retryable_failures_are_retried_and_counted() -> None:
    failures = [SendError("refused", retryable=True), SendError("HTTP 500", retryable=True)]
    sink, health = FakeSink(failures), HealthCounters()
    transport = _transport(sink, health)
    transport.submit(_report(7))
    assert transport.close(5.0) is True
    assert sink.delivered == [[7]]
    assert health.snapshot().send_failures_total == 2
    assert health.snapshot().reports_dropped_total == 0


def test_permanent_failure_drops_the_batch_without_retry() -> None:
    sink, health = FakeSink([SendError("HTTP 400", retryable=False, status=400)]), HealthCounters()
    transport = _transport(sink, health)
    transport.submit(_report(1))
    transport.submit(_report(2))
    transport.close(5.0)
    assert sink.calls == 1
    assert health.snapshot().send_failures_total == 1
    assert health.snapshot().reports_dropped_total == 2


def test_exhausted_retries_drop_and_log_once() -> None:
    handler = ListHandler()
    logger = logging.getLogger("test.agent.transport.once")
    logger.addHandler(handler)
    logger.propagate = False
    failures = [SendError("refused", retryable=True) for _ in range(9)]
    sink, health = FakeSink(failures), HealthCounters()
    transport = _transport(
        sink, health, log=RateLimitedLog(60.0, logger=logger), flush_interval_s=0.001
    )
    for step in range(3):
        transport.submit(_report(step))
        expected_calls = 3 * (step + 1)
        wait_until(lambda: sink.calls >= expected_calls, "sink.calls >= expected_calls")  # noqa: B023
    transport.close(5.0)
    assert health.snapshot().send_failures_total == 9
    assert health.snapshot().reports_dropped_total == 3
    assert len([r for r in handler.records if "failed" in r.getMessage()]) == 1


def test_close_gives_up_at_the_deadline_and_counts_leftovers() -> None:
    gate = threading.Event()  # never set: the sink hangs until its timeout
    sink, health = FakeSink(gate=gate), HealthCounters()
    transport = _transport(
        sink, health, retry=RetryPolicy(max_attempts=5, base_s=0.01, request_timeout_s=30.0)
    )
    for step in range(6):
        transport.submit(_report(step))
    wait_until(lambda: sink.sending, "sink.sending")
    assert transport.close(0.3) is False
    # close returned while the send it gave up on still hangs (a close that waited for the
    # sink would return only once the send failed, 30 s later)
    assert sink.sending and sink.calls == 1
    assert health.snapshot().reports_dropped_total == 6
    gate.set()  # let the sender thread end


def test_submit_after_close_is_counted_not_raised() -> None:
    sink, health = FakeSink(), HealthCounters()
    transport = _transport(sink, health)
    transport.close(1.0)
    transport.submit(_report(1))
    assert health.snapshot().reports_dropped_total == 1


@pytest.mark.parametrize(
    ("attempt", "base", "cap", "expected"),
    [
        (1, 0.5, 30.0, 0.5),
        (2, 0.5, 30.0, 1.0),
        (3, 0.5, 30.0, 2.0),
        (7, 0.5, 30.0, 30.0),
        (200, 0.5, 30.0, 30.0),
        (1, 0.0, 30.0, 0.0),
    ],
)
def test_backoff_delays(attempt: int, base: float, cap: float, expected: float) -> None:
    assert backoff_delay_s(attempt, base, cap) == expected


def test_rate_limited_log_counts_suppressed_messages() -> None:
    handler = ListHandler()
    logger = logging.getLogger("test.agent.ratelimit")
    logger.addHandler(handler)
    logger.propagate = False
    now = [100.0]
    log = RateLimitedLog(10.0, logger=logger, clock=lambda: now[0])
    assert log.warning("k", "first") is True
    assert log.warning("k", "second") is False
    assert log.warning("other", "other kind") is True
    now[0] += 10.0
    assert log.warning("k", "third") is True
    assert [r.getMessage() for r in handler.records] == [
        "first",
        "other kind",
        "third (1 similar messages suppressed)",
    ]


# --- the real sinks ----------------------------------------------------------------------------


def _batch(steps: Sequence[int]) -> bytes:
    return json.dumps(batch_dict(steps=list(steps))).encode()


@pytest.mark.slow  # a real HTTP server on 127.0.0.1
def test_http_sink_posts_gzip_and_bearer_token() -> None:
    stub = helpers.StubCollector(token="s3cret")
    try:
        HttpSink(stub.url, token="s3cret").send(_batch([1]), 2.0)
        HttpSink(stub.url + "/", token="s3cret").send(_batch(range(2, 200)), 2.0)
        assert [len(b.reports) for b in stub.batches] == [1, 198]
        assert stub.gzip_bodies == 1  # only the large body is compressed
        with pytest.raises(SendError) as caught:
            HttpSink(stub.url, token="wrong").send(_batch([1]), 2.0)
        assert (caught.value.status, caught.value.retryable) == (401, False)
    finally:
        stub.close()


@pytest.mark.slow  # a real HTTP server on 127.0.0.1
@pytest.mark.parametrize(
    ("status", "retryable"), [(500, True), (503, True), (429, True), (400, False), (413, False)]
)
def test_http_sink_error_statuses(status: int, retryable: bool) -> None:
    stub = helpers.StubCollector(status=status)
    try:
        with pytest.raises(SendError) as caught:
            HttpSink(stub.url).send(_batch([1]), 2.0)
        assert caught.value.status == status
        assert caught.value.retryable is retryable
        assert "injected failure" in str(caught.value)
    finally:
        stub.close()


@pytest.mark.slow  # a real HTTP server on 127.0.0.1
def test_http_sink_absent_collector_is_retryable() -> None:
    with pytest.raises(SendError) as caught:
        HttpSink(helpers.closed_port_url()).send(_batch([1]), 2.0)
    assert caught.value.retryable and caught.value.status is None


@pytest.mark.slow  # a real HTTP server on 127.0.0.1
def test_http_sink_hanging_collector_times_out() -> None:
    # The collector never answers, so only the sink's own timeout can end the send: it must not
    # end before 0.2 s, and must end (a send that ignores its timeout is still running at 30 s;
    # how late after 0.2 s it ends depends on the machine's load, so no tighter bound).
    hanging = helpers.HangingCollector()
    outcome: list[BaseException | float] = []

    def send() -> None:
        started = time.monotonic()
        try:
            HttpSink(hanging.url).send(_batch([1]), 0.2)
        except BaseException as exc:  # the test's assertion reads what it was
            outcome.append(exc)
        outcome.append(time.monotonic() - started)

    try:
        sender = threading.Thread(target=send, daemon=True)
        sender.start()
        sender.join(timeout=30.0)
        assert not sender.is_alive(), "the send ignored its timeout"
        error, elapsed = outcome
        assert isinstance(error, SendError) and error.retryable, error
        assert isinstance(elapsed, float) and elapsed >= 0.15
    finally:
        hanging.close()


def test_http_sink_rejects_bad_urls() -> None:
    with pytest.raises(ValueError):
        HttpSink("ftp://example.org")


def test_jsonl_sink_appends_one_line_per_batch_and_shares_files(tmp_path: Path) -> None:
    path = tmp_path / "sub" / "out.jsonl"
    first, second = JsonlSink(str(path)), JsonlSink(str(path))
    first.send(_batch([1]), 1.0)
    second.send(_batch([2]), 1.0)
    first.send(_batch([3]) + b"\n", 1.0)
    first.close()
    second.close()
    lines = path.read_text().splitlines()
    assert [json.loads(line)["reports"][0]["step"] for line in lines] == [1, 2, 3]


# --- outages: keep the batch while the buffer has room -----------------------------------------


class OutageSink(FakeSink):
    """Fails (retryably, optionally asking for `retry_after_s`) until `up` is set."""

    def __init__(self, retry_after_s: float | None = None) -> None:
        super().__init__()
        self.up = threading.Event()
        self.retry_after_s = retry_after_s
        self.call_times: list[float] = []

    def send(self, body: bytes, timeout_s: float) -> None:
        self.call_times.append(time.monotonic())
        if not self.up.is_set():
            self.calls += 1
            raise SendError("refused", retryable=True, retry_after_s=self.retry_after_s)
        super().send(body, timeout_s)


def test_a_failing_batch_is_kept_while_the_buffer_has_room() -> None:
    sink, health = OutageSink(), HealthCounters()
    transport = _transport(
        sink, health, retry=RetryPolicy(base_s=0.001, max_s=0.005), flush_interval_s=0.0
    )
    for step in range(3):
        transport.submit(_report(step))
    wait_until(
        lambda: sink.calls >= 30, "sink.calls >= 30"
    )  # far more attempts than any fixed budget
    sink.up.set()
    assert transport.close(5.0) is True
    assert [s for batch in sink.delivered for s in batch] == [0, 1, 2]
    assert health.snapshot().reports_dropped_total == 0


def test_a_full_buffer_drops_the_oldest_of_the_retried_batch_first() -> None:
    sink, health = OutageSink(), HealthCounters()
    transport = _transport(
        sink, health, max_queue_reports=4, retry=RetryPolicy(base_s=0.02, max_s=0.02)
    )
    for step in range(4):  # one full batch, failing
        transport.submit(_report(step))
    wait_until(lambda: sink.calls >= 2, "sink.calls >= 2")
    for step in range(4, 6):
        transport.submit(_report(step))
    assert health.snapshot().reports_dropped_total == 2
    sink.up.set()
    assert transport.close(5.0) is True
    assert [s for batch in sink.delivered for s in batch] == [2, 3, 4, 5]


def test_retry_after_lengthens_the_backoff_up_to_its_cap() -> None:
    sink, health = OutageSink(retry_after_s=0.3), HealthCounters()
    transport = _transport(
        sink, health, retry=RetryPolicy(base_s=0.001, max_s=1.0), flush_interval_s=0.0
    )
    transport.submit(_report(1))
    wait_until(lambda: len(sink.call_times) >= 2, "len(sink.call_times) >= 2")
    assert sink.call_times[1] - sink.call_times[0] >= 0.29
    transport.close(0.01)

    capped = OutageSink(retry_after_s=3600.0)
    transport = _transport(
        capped, health, retry=RetryPolicy(base_s=0.001, max_s=0.05), flush_interval_s=0.0
    )
    transport.submit(_report(1))
    wait_until(lambda: len(capped.call_times) >= 3, "len(capped.call_times) >= 3")
    transport.close(0.01)


def test_a_buffer_smaller_than_a_batch_warns_once_at_construction() -> None:
    handler = ListHandler()
    logger = logging.getLogger("test.agent.transport.small")
    logger.addHandler(handler)
    logger.propagate = False
    sink, health = FakeSink(), HealthCounters()
    log = RateLimitedLog(60.0, logger=logger)
    transport = _transport(sink, health, log=log, max_queue_reports=3, max_batch_reports=8)
    for step in range(3):  # a full buffer is sent at once, not after the 60 s flush interval
        transport.submit(_report(step))
    wait_until(lambda: sink.delivered == [[0, 1, 2]], "sink.delivered == [[0, 1, 2]]")
    assert transport.close(5.0) is True
    messages = [r.getMessage() for r in handler.records]
    assert len([m for m in messages if "fewer than one batch" in m]) == 1
    _transport(FakeSink(), HealthCounters(), log=log, max_queue_reports=8).close(1.0)
    assert len(handler.records) == 1  # a big enough buffer says nothing


class TricklingCollector:
    """Answers every request one byte every 50 ms (a collector that never quite times out)."""

    answer = b"HTTP/1.1 200 OK\r\nX-Padding: " + b"x" * 1000

    def __init__(self) -> None:
        self._socket = socket.create_server(("127.0.0.1", 0))
        self._stop = threading.Event()
        self.sent = 0  # bytes of `answer` sent
        threading.Thread(target=self._serve, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._socket.getsockname()[1]}"

    def _serve(self) -> None:
        connection, _ = self._socket.accept()
        with connection:
            connection.recv(65536)
            for byte in self.answer:
                if self._stop.wait(0.05):
                    return
                with contextlib.suppress(OSError):
                    connection.sendall(bytes([byte]))
                    self.sent += 1

    def close(self) -> None:
        self._stop.set()
        self._socket.close()


@pytest.mark.slow  # a real HTTP server on 127.0.0.1
def test_http_sink_timeout_is_a_deadline_for_the_whole_exchange() -> None:
    trickling = TricklingCollector()
    try:
        with pytest.raises(SendError) as caught:
            HttpSink(trickling.url).send(_batch([1]), 0.5)
        assert caught.value.retryable
        # the sink gave up while the collector still had most of its answer to send (one byte
        # every 50 ms: each read returns within any per-read timeout)
        assert trickling.sent < len(trickling.answer) // 2
    finally:
        trickling.close()


@pytest.mark.slow  # a real HTTP server on 127.0.0.1
def test_http_sink_sends_without_a_thread_of_its_own(monkeypatch: pytest.MonkeyPatch) -> None:
    # the agent's thread budget: the deadline is kept by the socket, not a timer thread per send
    trickling = TricklingCollector()
    try:

        def no_thread(self: threading.Thread) -> None:
            raise AssertionError(f"a send started a thread: {self.name}")

        monkeypatch.setattr(threading.Thread, "start", no_thread)
        with pytest.raises(SendError):
            HttpSink(trickling.url).send(_batch([1]), 0.2)
    finally:
        monkeypatch.undo()
        trickling.close()


@pytest.mark.parametrize(
    ("header", "expected"),
    [("7", 7.0), ("0", 0.0), (None, None), ("soon", None), ("99999999999999999", 1e9)],
)
def test_http_sink_reads_retry_after(header: str | None, expected: float | None) -> None:
    assert sinks._retry_after_s(header) == expected


def test_status_batches_go_out_while_no_report_does() -> None:
    sink, health = FakeSink(), HealthCounters()
    transport = _transport(sink, health, heartbeat_s=0.05)
    # Nothing to send: an empty (status) batch every heartbeat.
    wait_until(lambda: len(sink.delivered) >= 3, "len(sink.delivered) >= 3")
    assert all(batch == [] for batch in sink.delivered)
    transport.submit(_report(1))
    assert transport.close(5.0) is True
    assert [1] in sink.delivered


def test_a_status_batch_is_sent_once_not_retried_and_at_close_on_request() -> None:
    sink, health = FakeSink(failures=[SendError("down", retryable=True)]), HealthCounters()
    transport = _transport(sink, health, heartbeat_s=60.0)
    transport.request_status()
    wait_until(lambda: sink.calls == 1, "sink.calls == 1")  # the status batch went out, and failed
    transport.submit(_report(1))
    transport.request_status()  # what the agent does at close, with nothing else to send
    assert transport.close(5.0) is True
    # a retried status batch would have been delivered before the report: it was not retried
    assert sink.delivered == [[1], []] and sink.calls == 3
    assert health.snapshot().send_failures_total == 1


def test_without_heartbeats_no_status_batch_is_ever_sent() -> None:
    sink, health = FakeSink(), HealthCounters()
    transport = _transport(sink, health)  # a JSONL file gets no status batches
    transport.request_status()
    transport.submit(_report(1))
    assert transport.close(5.0) is True
    assert sink.delivered == [[1]] and sink.calls == 1
