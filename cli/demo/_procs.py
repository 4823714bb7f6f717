"""Child processes of `mfuscope demo`, and stopping all of them with nothing left behind.

Each child starts in its own session (so a terminal's Ctrl-C reaches only the demo, which then
stops the children in order). torchrun starts its workers in sessions of their own too, so a
process-group signal is not enough: before signalling, the whole process tree under each child is
collected from ``/proc`` and every member is signalled; what survives the grace period is killed.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

__all__ = ["Child", "Supervisor", "process_tree"]

PROC = Path("/proc")


def _parent_pids(proc: Path = PROC) -> dict[int, int]:
    """pid -> parent pid for every visible process (empty where /proc does not exist)."""
    parents: dict[int, int] = {}
    for entry in proc.glob("[0-9]*"):
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue  # exited meanwhile
        # Field 2 (comm) is parenthesised and may hold spaces: parse after the last ')'.
        fields = stat[stat.rindex(")") + 2 :].split()
        parents[int(entry.name)] = int(fields[1])
    return parents


def process_tree(root: int, proc: Path = PROC) -> list[int]:
    """`root` and all its live descendants, parents before children."""
    children: dict[int, list[int]] = {}
    for pid, parent in _parent_pids(proc).items():
        children.setdefault(parent, []).append(pid)
    tree, frontier = [root], [root]
    while frontier:
        frontier = [c for pid in frontier for c in sorted(children.get(pid, ()))]
        tree += frontier
    return tree


def _start_time(pid: int, proc: Path = PROC) -> int | None:
    """The process's start time in clock ticks since boot (tells a reused pid apart)."""
    try:
        stat = (proc / str(pid) / "stat").read_text()
    except OSError:
        return None
    return int(stat[stat.rindex(")") + 2 :].split()[19])


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie still answers signal 0; it is dead for our purposes (its parent reaps it).
    try:
        state = (PROC / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return True
    return state != "Z"


def _signal(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(pid, sig)


@dataclass
class Child:
    name: str
    popen: subprocess.Popen[bytes]
    log: IO[bytes] | None
    # Descendants seen while running (pid -> start time): a worker orphaned by a crashed parent
    # is reparented away from the tree but must still be stopped.
    seen: dict[int, int] = field(default_factory=dict)

    @property
    def pid(self) -> int:
        return self.popen.pid

    def running(self) -> bool:
        return self.popen.poll() is None


class Supervisor:
    """Starts children and stops every one of them (and their trees), in reverse start order."""

    def __init__(self, cwd: Path | None = None) -> None:
        self.children: list[Child] = []
        # Children run in `cwd` (the demo's temporary directory): `python -m` puts the working
        # directory first on sys.path, and a stray `timeit.py` there would shadow the stdlib.
        self.cwd = cwd

    def start(
        self,
        name: str,
        argv: Sequence[str],
        env: Mapping[str, str],
        log_path: Path | None = None,
        *,
        pipe_stdout: bool = False,
        cwd: Path | None = None,
    ) -> Child:
        """Start `argv` in a new session; output to `log_path`, or a pipe when `pipe_stdout`."""
        log = None if pipe_stdout or log_path is None else log_path.open("ab")
        try:
            popen = subprocess.Popen(
                list(argv),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE if pipe_stdout else (log or subprocess.DEVNULL),
                stderr=subprocess.STDOUT,
                env=dict(env),
                cwd=cwd or self.cwd,
                start_new_session=True,
            )
        except BaseException:
            if log:
                log.close()
            raise
        child = Child(name, popen, log)
        self.children.append(child)
        return child

    def observe(self) -> None:
        """Remember the current descendants of every running child (call it now and then)."""
        for child in self.children:
            if child.running():
                for pid in process_tree(child.pid)[1:]:
                    started = _start_time(pid)
                    if started is not None:
                        child.seen.setdefault(pid, started)

    def _tree(self, child: Child) -> list[int]:
        tree = process_tree(child.pid) if child.running() else []
        orphans = [p for p, t in child.seen.items() if p not in tree and _start_time(p) == t]
        return tree + orphans

    def stop(self, child: Child, grace_s: float = 5.0) -> None:
        """SIGTERM the child's whole tree, wait up to `grace_s`, SIGKILL what is left, reap."""
        tree = self._tree(child)
        for pid in tree:
            _signal(pid, signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        while any(_alive(p) for p in tree if p != child.pid) or child.running():
            if time.monotonic() >= deadline:
                # Late-born descendants too: take the tree again before the final blow.
                for pid in {*tree, *self._tree(child)}:
                    _signal(pid, signal.SIGKILL)
                break
            time.sleep(0.05)
        try:
            child.popen.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            _signal(child.pid, signal.SIGKILL)
            child.popen.wait()
        if child.popen.stdout:
            child.popen.stdout.close()
        if child.log:
            child.log.close()
        if child in self.children:
            self.children.remove(child)

    def stop_all(self, grace_s: float = 5.0) -> None:
        """Stop every child still known, the most recently started first."""
        for child in reversed(list(self.children)):
            self.stop(child, grace_s)
