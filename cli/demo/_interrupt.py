"""Ctrl-C, SIGTERM and SIGHUP stop the demo, and none of them can be lost.

The handler raises `KeyboardInterrupt` in the main thread, which breaks out of whatever it waits
in. It also records the signal: Python drops an exception raised while the main thread runs a
finalizer or a weakref callback (it prints "Exception ignored in ..." and carries on), and the
demo's loop makes garbage with finalizers (HTTP responses, sockets) all the time. So every wait
loop of the demo calls `check()` once per turn, which raises the recorded interrupt again.
"""

from __future__ import annotations

import signal
from collections.abc import Callable
from types import FrameType

__all__ = ["check", "install"]

_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
_received: list[str] = []


def _handle(signum: int, frame: FrameType | None) -> None:
    name = signal.Signals(signum).name
    _received.append(name)
    raise KeyboardInterrupt(name)


def check() -> None:
    """Raise `KeyboardInterrupt` if a stopping signal arrived (even one whose exception was
    dropped); cheap enough for every turn of a polling loop."""
    if _received:
        raise KeyboardInterrupt(_received[0])


def install() -> Callable[[], None]:
    """Handle the stopping signals; returns the function that restores the previous handlers and
    forgets what was received. Main thread only (as `signal.signal`)."""
    _received.clear()
    previous = {s: signal.signal(s, _handle) for s in _SIGNALS}

    def restore() -> None:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        _received.clear()

    return restore
