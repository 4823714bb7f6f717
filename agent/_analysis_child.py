"""A profiled window's analysis in a child process, so that it never holds the training process's
GIL.

Reading and decomposing a window's trace is CPU work in C extensions (the JSON decoder, numpy) that
hold the GIL for long stretches: on a 12 MB CPU trace, single holds of 390 ms (decoding) and 620 ms
(decomposing) on a loaded 2-core machine, and 270 ms in all on a 0.65 MB-gzipped DDP window. On the
analyser thread that froze the training thread's Python for that long after every window: its steps
slowed, and on CPU timelines their blocked time (a wait for the GIL) read as exposed communication
(docs/definitions.md#carried-breakdowns). In a child the analysis costs the same CPU and no GIL; the
trace's export (which releases the GIL) stays on the analyser thread, which waits for the answer on
a pipe.

The child is ``python -m mfuscope.agent._analysis_child``, started at the first window and kept for
the next ones; it imports `mfuscope.core.trace`, never torch nor the user's code. Requests and
answers are length-prefixed pickles on its stdin and stdout. Where it cannot start or stops
answering, the analysis runs on the analyser thread as before (`ChildAnalysis.fallback`); the
window's result is the same.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from typing import IO, Any

__all__ = ["AnalysisFailed", "ChildAnalysis", "analyse_in_process", "main"]

_HEADER = struct.Struct("<Q")


def analyse_in_process(path: str, options: Any) -> Sequence[Any]:
    """The engine on one trace file: its steps' decompositions."""
    from mfuscope.core.trace import analyze_trace, read_trace

    steps: Sequence[Any] = analyze_trace(read_trace(path), options).steps
    return steps


class AnalysisFailed(RuntimeError):
    """The analysis failed in the child; the message is its error (``Type: message``)."""


class ChildAnalysis:
    """`__call__(path, options)` runs `analyse_in_process` in the child (one call at a time: the
    analyser thread's). Raises `AnalysisFailed` when the analysis failed there. `fallback` turns
    true, for good, when the child cannot be used (`why` says why); calls then run here.
    `cpu_s`: the CPU time the child spent analysing so far (the window's cost counts it, as it
    counts the analyser thread's own)."""

    def __init__(
        self,
        command: Sequence[str] | None = None,
        timeout_s: float = 5.0,
        on_fallback: Callable[[str], object] | None = None,
    ) -> None:
        """`on_fallback(why)`: told once, when the analysis moves back to the thread (must not
        raise)."""
        self._command = list(command or [sys.executable, "-m", "mfuscope.agent._analysis_child"])
        self._timeout_s = timeout_s
        self._on_fallback = on_fallback
        self._process: subprocess.Popen[bytes] | None = None
        self._lock = threading.Lock()
        self.fallback = False
        self.why: str | None = None  # why the child is not used
        self.cpu_s = 0.0

    def __call__(self, path: str, options: Any) -> Sequence[Any]:
        with self._lock:
            if not self.fallback:
                try:
                    status, value, cpu_s = self._ask(path, options)
                except Exception as exc:  # the child, the pipe or a pickle: back to the thread
                    self._give_up(f"{type(exc).__name__}: {exc}")
                else:
                    self.cpu_s += cpu_s
                    if status == "ok":
                        steps: Sequence[Any] = value
                        return steps
                    raise AnalysisFailed(value)
        return analyse_in_process(path, options)

    def _ask(self, path: str, options: Any) -> tuple[str, Any, float]:
        process = self._process
        if process is None or process.poll() is not None:
            process = self._process = subprocess.Popen(
                self._command,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
                close_fds=True,
            )
        assert process.stdin is not None and process.stdout is not None
        _write(process.stdin, (path, options))
        answer = _read(process.stdout)
        if not (isinstance(answer, tuple) and len(answer) == 3):
            raise EOFError(f"the analysis child answered {type(answer).__name__}")
        return answer

    def _give_up(self, why: str) -> None:
        self.fallback = True
        self.why = why
        self._stop()
        if self._on_fallback is not None:
            self._on_fallback(why)

    def close(self) -> None:
        """Stop the child (at the agent's close); never raises."""
        with self._lock:
            self._stop()

    def _stop(self) -> None:
        process, self._process = self._process, None
        if process is None:
            return
        with contextlib.suppress(Exception):
            assert process.stdin is not None
            process.stdin.close()  # the child's loop ends at end of input
        try:
            process.wait(self._timeout_s)
        except subprocess.TimeoutExpired:
            process.kill()
            with contextlib.suppress(Exception):
                process.wait(self._timeout_s)
        with contextlib.suppress(Exception):
            assert process.stdout is not None
            process.stdout.close()


def _write(stream: IO[bytes], value: object) -> None:
    body = pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
    stream.write(_HEADER.pack(len(body)) + body)
    stream.flush()


def _read(stream: IO[bytes]) -> Any:
    header = stream.read(_HEADER.size)
    if len(header) < _HEADER.size:
        raise EOFError("end of input")
    (size,) = _HEADER.unpack(header)
    body = stream.read(size)
    if len(body) < size:
        raise EOFError("end of input")
    return pickle.loads(body)


def main(
    stdin: IO[bytes] | None = None,
    stdout: IO[bytes] | None = None,
    analyse: Callable[[str, Any], Sequence[Any]] = analyse_in_process,
) -> None:
    """The child: answer each ``(path, options)`` request with ``("ok", steps, cpu_s)``, or
    ``("error", "Type: message", cpu_s)`` when its analysis fails, until its input ends."""
    source = stdin or sys.stdin.buffer
    sink = stdout or sys.stdout.buffer
    while True:
        try:
            path, options = _read(source)
        except EOFError:
            return
        started = time.process_time()
        try:
            answer: tuple[str, object] = ("ok", tuple(analyse(path, options)))
        except Exception as exc:
            answer = ("error", f"{type(exc).__name__}: {exc}")
        _write(sink, (*answer, time.process_time() - started))


def _child() -> None:
    """The answers go to the file descriptor stdout was; anything the analysis prints goes to
    stderr, so that it cannot break the protocol."""
    sink = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    main(sys.stdin.buffer, sink)


if __name__ == "__main__":
    _child()
