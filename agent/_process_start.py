"""When this process started, on the wall clock: where the job-time ledger's ``startup`` begins
(docs/definitions.md#job-time-ledger).

The kernel keeps a process's start as clock ticks after boot (``/proc/self/stat``, field 22);
``/proc/uptime`` says how long ago boot was, so the start is ``now - (uptime - ticks / hz)``:
good to about 10 ms (a tick; ``btime`` in ``/proc/stat`` would give only whole seconds). The
``/proc`` root is a parameter, so tests give a fake one.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable

__all__ = ["process_start_unix_ns", "start_from_proc"]

# Field 22 (starttime) is the 20th after the command name's closing parenthesis (field 2 may
# hold spaces and parentheses itself, so fields are counted from its last ')').
_STARTTIME_AFTER_COMM = 19


def start_from_proc(stat: str, uptime: str, ticks_per_s: int, now_unix_ns: int) -> int:
    """The process start (ns since the epoch) from the text of ``/proc/self/stat`` and of
    ``/proc/uptime`` read at `now_unix_ns`. Raises ValueError on text it cannot read."""
    fields = stat[stat.rindex(")") + 1 :].split()
    started_s = int(fields[_STARTTIME_AFTER_COMM]) / ticks_per_s
    up_s = float(uptime.split()[0])
    if ticks_per_s <= 0 or started_s > up_s + 1.0:
        raise ValueError(f"a start {started_s} s after boot, {up_s} s after it")
    return now_unix_ns - round((up_s - min(started_s, up_s)) * 1e9)


def process_start_unix_ns(
    proc: str = "/proc", now_unix_ns: Callable[[], int] = time.time_ns
) -> int | None:
    """This process's start (ns since the epoch); None where ``/proc`` cannot tell (not Linux)."""
    try:
        with open(os.path.join(proc, "self", "stat"), encoding="utf-8", errors="replace") as f:
            stat = f.read()
        with open(os.path.join(proc, "uptime"), encoding="ascii") as f:
            uptime = f.read()
        now = now_unix_ns()  # right after the uptime: the two are read together
        return start_from_proc(stat, uptime, os.sysconf("SC_CLK_TCK"), now)
    except (OSError, ValueError, IndexError):
        return None
