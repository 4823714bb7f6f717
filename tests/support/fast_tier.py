"""What a test not marked `slow` may not do: start a process, bind or connect a socket, sleep.

`guard(nodeid)` replaces those calls, for the time of one test (its setup, call and teardown), by
ones that record the attempt and raise `FastTierViolation`. The attempts are recorded as well as
raised because the code under test may catch the error (a transport that counts a failed
connection and carries on): `Guard.check` fails the test on any attempt, caught or not. Std lib
only; the root conftest applies it.
"""

from __future__ import annotations

import _posixsubprocess
import os
import socket
import subprocess
import threading
import time
from collections.abc import Callable
from typing import Any

__all__ = ["FastTierViolation", "Guard"]

_ADVICE = (
    "mark the test @pytest.mark.slow, or give the code under test a fake "
    "(a scripted clock, an in-process transport)"
)


class FastTierViolation(RuntimeError):
    """A test not marked slow started a process, used a socket or slept."""


class Guard:
    """Replaces the forbidden calls while started; remembers every attempt."""

    def __init__(self, nodeid: str) -> None:
        self.nodeid = nodeid
        self.attempts: list[str] = []
        self._saved: list[tuple[Any, str, Any]] = []

    def _refuse(self, what: str) -> Callable[..., Any]:
        def refused(*args: object, **kwargs: object) -> Any:
            message = f"{what} (thread {threading.current_thread().name})"
            self.attempts.append(message)
            raise FastTierViolation(f"{self.nodeid}: {message} in a fast test: {_ADVICE}")

        return refused

    def _replace(self, owner: Any, name: str, what: str) -> None:
        self._saved.append((owner, name, getattr(owner, name)))
        setattr(owner, name, self._refuse(what))

    def start(self) -> None:
        self._replace(subprocess.Popen, "_execute_child", "a child process")
        self._replace(_posixsubprocess, "fork_exec", "a child process")
        for name in ("fork", "forkpty", "posix_spawn", "posix_spawnp", "system"):
            if hasattr(os, name):
                self._replace(os, name, f"os.{name}")
        for name in ("bind", "connect", "connect_ex"):
            self._replace(socket.socket, name, f"socket.{name}")
        sleep = time.sleep
        refused = self._refuse("time.sleep (wait on an event or a scripted clock)")

        def guarded_sleep(seconds: float) -> None:
            # sleep(0) only hands the GIL to another thread (the agent does, between chunks).
            (sleep if seconds == 0 else refused)(seconds)

        self._saved.append((time, "sleep", sleep))
        time.sleep = guarded_sleep

    def stop(self) -> None:
        while self._saved:
            owner, name, original = self._saved.pop()
            setattr(owner, name, original)

    def check(self) -> None:
        """Raise `FastTierViolation` naming the attempts so far (each reported once)."""
        if self.attempts:
            attempts, self.attempts = self.attempts, []
            raise FastTierViolation(
                f"{self.nodeid} is not marked slow but tried: {'; '.join(attempts)}: {_ADVICE}"
            )
