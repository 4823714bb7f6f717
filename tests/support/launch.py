"""Start the ranks of a test job as `torchrun --standalone` does, importing torch once for all
of them; and the one builder of a test job's command line and environment (`job_command`).

As a script it is one process that a test runs, waits for, signals or kills like torchrun:

    python -u tests/support/launch.py --nproc_per_node=2 [--preload MODULE,...] [-m]
        SCRIPT_OR_MODULE [ARGS...]

It imports the `--preload` modules, then forks once per rank; each rank runs SCRIPT (or MODULE) as
``__main__`` with ARGS as `sys.argv`, as `python -u SCRIPT ARGS` would, with the variables torchrun
gives its workers (`RANK`, `LOCAL_RANK`, `WORLD_SIZE`, `LOCAL_WORLD_SIZE`, `GROUP_RANK`,
`GROUP_WORLD_SIZE`, `ROLE_NAME`, `ROLE_RANK`, `ROLE_WORLD_SIZE`, `MASTER_ADDR`, `MASTER_PORT`,
`OMP_NUM_THREADS` unless set). The launcher waits for them, and exits 0 once all have exited 0.
When a rank fails it stops the others (SIGTERM, SIGKILL after 30 s) and exits 1; a SIGTERM, SIGINT
or SIGHUP it receives goes to every rank the same way, and it exits 128 + the signal. As under
torchrun each rank runs in a session of its own, so a signal to the launcher's process group
reaches the launcher alone; unlike torchrun a rank also dies when the launcher dies (a SIGKILL, a
test's timeout): no orphan rank keeps the machine busy. Rank 0 serves the job's store on
`MASTER_PORT` (torchrun's agent serves it instead, and sets the `TORCHELASTIC_*` variables, which
this launcher leaves out: a test of elastic restarts or of the torchrun run id runs torchrun).

Why: torchrun imports torch itself and runs an elastic agent and a rendezvous before the workers
start, ~2.6 s of CPU and ~3 s of wall time per launch on 2 cores; then every worker imports torch
again, and torch._dynamo (building a torch.optim optimizer imports it) and torch.profiler: ~6 s of
CPU per rank on this machine. Here they are imported once per launch, before the fork, and the
ranks share those pages. A forked rank differs from a fresh process only in what was imported
before its variables were set (torch reads none of them at import) and in its command line in
/proc (the agent reads neither); the jobs' own code, the agent and the collectives run as under
torchrun, which the tests about the launch path still use.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import random
import runpy
import signal
import socket
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from types import FrameType

# The launcher runs as a script with the repository root on PYTHONPATH (`job_env`); processes
# imports no torch.
from tests.support.processes import free_port

__all__ = ["TORCHRUN", "job_command", "job_env"]

ROOT = Path(__file__).resolve().parents[2]
TORCHRUN = Path(sys.executable).parent / "torchrun"
STOP_GRACE_S = 30.0  # torchrun's too: from the first signal to SIGKILL
_PR_SET_PDEATHSIG = 1


# What a test job's rank imports before its first step: torch, its collectives, torch._dynamo
# (a torch.optim optimizer imports it when built) and the profiler of the agent's windows.
PRELOAD = ("torch", "torch.distributed", "torch._dynamo", "torch.profiler")


def job_command(
    target: str | Path,
    *args: str,
    temp: Path,
    ranks: int = 2,
    module: bool = False,
    torchrun: bool = False,
    preload: Sequence[str] = PRELOAD,
) -> tuple[list[str], dict[str, str]]:
    """The command line and environment (`job_env`) that run `target` (a script, or a module
    with `module`) with `args` on `ranks` gloo ranks: this launcher, importing `preload` once
    for every rank, or real torchrun where the test is about torchrun's launch path
    (`torchrun`)."""
    if torchrun:
        launcher = [str(TORCHRUN), "--standalone"]
    else:
        launcher = [
            sys.executable,
            "-u",
            __file__,
            *(["--preload", ",".join(preload)] * bool(preload)),
        ]
    command = [*launcher, f"--nproc_per_node={ranks}", *(["-m"] if module else []), str(target)]
    return [*command, *args], job_env(temp)


def job_env(temp: Path) -> dict[str, str]:
    """The environment of a test job: the caller's less its agent options (``MFUSCOPE_*``) and
    flight-recorder settings (``TORCH_FR*``), with one OpenMP thread per process, `temp`
    (created) as ``TMPDIR`` (profiler traces land there) and the repository root on
    ``PYTHONPATH`` (jobs import ``tests.support``)."""
    temp.mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MFUSCOPE_", "TORCH_FR"))}
    env.update(OMP_NUM_THREADS="1", TMPDIR=str(temp), PYTHONPATH=str(ROOT))
    return env


def _free_port() -> int:
    """A port free now below the kernel's ephemeral range: no outgoing connection takes it as
    its local port before rank 0 binds it, seconds later, once torch is imported (a port 0
    pick could be). Only another bind can, and another launcher's pick is a 1 in 10,000 chance."""
    try:
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768
    candidates = list(range(max(low - 10_000, 1024), low)) or [0]
    for port in random.sample(candidates, min(len(candidates), 50)):
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    return free_port()


def _die_with_parent(launcher: int) -> None:
    """In each rank: SIGKILL when the launcher dies (Linux `prctl`); at once if it already has."""
    import ctypes

    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != launcher:
        os._exit(1)


def _rank_env(rank: int, ranks: int, port: int) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TORCHELASTIC_")}
    env.setdefault("OMP_NUM_THREADS", "1")  # torchrun's default with more than one rank
    env.update(
        RANK=str(rank),
        LOCAL_RANK=str(rank),
        WORLD_SIZE=str(ranks),
        LOCAL_WORLD_SIZE=str(ranks),
        GROUP_RANK="0",
        GROUP_WORLD_SIZE="1",
        ROLE_NAME="default",
        ROLE_RANK=str(rank),
        ROLE_WORLD_SIZE=str(ranks),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
    )
    return env


class _Signalled(Exception):
    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


def _raise(signum: int, _frame: FrameType | None) -> None:
    raise _Signalled(signum)


def _stop(live: dict[int, int], signum: int) -> None:
    """Send `signum` to the ranks in `live` (pid -> rank), SIGKILL what is left after the
    grace period, and reap them all."""
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)  # one stop at a time
    for pid in live:
        with contextlib.suppress(ProcessLookupError):  # exited, not reaped yet: still there
            os.kill(pid, signum)
    deadline = time.monotonic() + STOP_GRACE_S
    while live:
        pid, _ = os.waitpid(-1, os.WNOHANG)
        if pid:
            live.pop(pid, None)
            continue
        if time.monotonic() > deadline:
            for pid in live:
                os.kill(pid, signal.SIGKILL)
            deadline = float("inf")
        time.sleep(0.05)


class Rank:
    """A forked rank, back at the launcher's top level: `run` runs the target as ``__main__``
    and the interpreter then ends as `python SCRIPT` would (exceptions, exit codes, atexit)."""

    def __init__(self, target: Sequence[str], env: dict[str, str]) -> None:
        self.target = list(target)
        self.env = env

    def run(self) -> None:
        os.environ.clear()
        os.environ.update(self.env)
        if self.target[0] == "-m":
            sys.argv = self.target[1:]
            sys.path[0] = os.getcwd()
            runpy.run_module(self.target[1], run_name="__main__", alter_sys=True)
        else:
            script = os.path.abspath(self.target[0])
            sys.argv = [self.target[0], *self.target[1:]]
            sys.path[0] = os.path.dirname(script)
            runpy.run_path(script, run_name="__main__")


def launch(target: Sequence[str], ranks: int) -> int | Rank:
    """Run `target` (``[SCRIPT, ARGS...]`` or ``["-m", MODULE, ARGS...]``) on `ranks` ranks;
    the launcher's exit status (see the module docstring), or in a forked rank its `Rank`."""
    port = _free_port()
    launcher = os.getpid()
    live: dict[int, int] = {}
    # Fork with the default signal handlers and nothing to unwind: a rank returns to the top
    # level at once. A signal before the handlers below ends the launcher, and the ranks with it.
    for rank in range(ranks):
        env = _rank_env(rank, ranks, port)
        pid = os.fork()
        if pid == 0:
            os.setsid()  # as torchrun's workers: see the module docstring
            _die_with_parent(launcher)
            return Rank(target, env)
        live[pid] = rank
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, _raise)
    try:
        while live:
            pid, status = os.wait()  # every child of this process is a rank
            ended = live.pop(pid)
            code = os.waitstatus_to_exitcode(status)
            if code != 0:
                print(
                    f"launch: rank {ended} (pid {pid}) exited with {code}; stopping the others",
                    file=sys.stderr,
                    flush=True,
                )
                _stop(live, signal.SIGTERM)
                return 1
    except _Signalled as signalled:
        _stop(live, signalled.signum)
        return 128 + signalled.signum
    return 0


def main(argv: Sequence[str]) -> int | Rank:
    ranks = 1
    preload: list[str] = []
    rest = list(argv)
    while rest and rest[0].startswith(("--nproc", "--preload")):
        option = rest.pop(0)
        value = option.partition("=")[2] if "=" in option else rest.pop(0)
        if option.startswith("--nproc"):
            ranks = int(value)
        else:
            preload += [name for name in value.split(",") if name]
    if not rest or (rest[0] == "-m" and len(rest) < 2):
        print(__doc__.split("\n\n")[1], file=sys.stderr)
        return 2
    for name in preload:
        importlib.import_module(name)
    return launch(rest, ranks)


if __name__ == "__main__":
    outcome = main(sys.argv[1:])
    if not isinstance(outcome, Rank):
        sys.exit(outcome)
    outcome.run()
