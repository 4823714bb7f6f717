"""`tests/support/launch.py`, the launcher of the test jobs, on plain Python ranks: it runs each
rank's script as `python SCRIPT ARGS` would, after the modules it preloads, gives each rank
torchrun's variables, exits 0 when every rank does, stops the others and exits 1 when one fails,
and takes its ranks with it when it is killed."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import textwrap
from pathlib import Path

import pytest

from tests.support.launch import job_command
from tests.support.waiting import wait_until

pytestmark = pytest.mark.slow

RANK = textwrap.dedent(
    """
    import json, os, pathlib, sys, time
    out = pathlib.Path(sys.argv[1])
    names = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK",
             "ROLE_RANK", "ROLE_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "OMP_NUM_THREADS")
    rank = os.environ["RANK"]
    seen = {name: os.environ.get(name) for name in names}
    seen["session_leader"] = os.getsid(0) == os.getpid()
    # As `python SCRIPT ARGS` gives them, and the launcher's preloaded module already there.
    seen["argv"] = sys.argv
    seen["path0"] = sys.path[0]
    seen["preloaded"] = "xml.dom.minidom" in sys.modules
    (out / f"env{rank}.json").write_text(json.dumps(seen))
    (out / f"pid{rank}").write_text(str(os.getpid()))
    if sys.argv[2] == "fail" and rank == "1":
        sys.exit(3)
    if sys.argv[2] != "ok":
        time.sleep(600)  # stopped by the launcher
    """
)


def _job(tmp_path: Path, ranks: int, how: str) -> tuple[list[str], dict[str, str]]:
    script = tmp_path / "rank.py"
    script.write_text(RANK)
    return job_command(
        script, str(tmp_path), how, temp=tmp_path / "tmp", ranks=ranks, preload=["xml.dom.minidom"]
    )


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split(") ")[1][0] != "Z"
    except FileNotFoundError:
        return False


def test_every_rank_gets_torchruns_variables_in_a_session_of_its_own(tmp_path: Path) -> None:
    command, env = _job(tmp_path, 3, "ok")
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    seen = [json.loads((tmp_path / f"env{rank}.json").read_text()) for rank in range(3)]
    port = seen[0]["MASTER_PORT"]
    assert port.isdigit() and 0 < int(port) < 65536
    for rank, variables in enumerate(seen):
        assert variables == {
            "RANK": str(rank),
            "LOCAL_RANK": str(rank),
            "WORLD_SIZE": "3",
            "LOCAL_WORLD_SIZE": "3",
            "GROUP_RANK": "0",
            "ROLE_RANK": str(rank),
            "ROLE_WORLD_SIZE": "3",
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": port,
            "OMP_NUM_THREADS": "1",
            "session_leader": True,
            "argv": [str(tmp_path / "rank.py"), str(tmp_path), "ok"],
            "path0": str(tmp_path),
            "preloaded": True,
        }


def test_a_rank_ends_as_python_would(tmp_path: Path) -> None:
    """An uncaught exception: its traceback and exit status 1; atexit handlers run."""
    script = tmp_path / "rank.py"
    script.write_text(
        "import atexit, os, sys\n"
        "atexit.register(lambda: print('atexit', os.environ['RANK'], flush=True))\n"
        "if __name__ == '__main__' and os.environ['RANK'] == '0':\n"
        "    raise ValueError('rank 0 raised')\n"
    )
    command, env = job_command(script, temp=tmp_path / "tmp", ranks=2, preload=[])
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 1, done.stderr
    assert "ValueError: rank 0 raised" in done.stderr and "exited with 1" in done.stderr
    assert "atexit 0" in done.stdout


def test_a_failing_rank_stops_the_others_and_the_launch_fails(tmp_path: Path) -> None:
    command, env = _job(tmp_path, 2, "fail")
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 1
    assert "rank 1 (pid" in done.stderr and "exited with 3" in done.stderr
    assert not _alive(int((tmp_path / "pid0").read_text()))


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL])
def test_the_ranks_end_with_the_launcher(tmp_path: Path, sig: signal.Signals) -> None:
    """A SIGTERM is passed on to the ranks; a SIGKILL (a test's timeout) takes them along."""
    command, env = _job(tmp_path, 2, "hang")
    launcher = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL)
    ranks: list[int] = []
    try:
        pids = [tmp_path / f"pid{rank}" for rank in range(2)]
        wait_until(lambda: all(p.exists() and p.read_text() for p in pids), "both ranks")
        ranks = [int(p.read_text()) for p in pids]
        os.kill(launcher.pid, sig)
        code = launcher.wait(timeout=60)
        assert code == (128 + sig if sig == signal.SIGTERM else -sig)
        wait_until(lambda: not any(map(_alive, ranks)), "the ranks to end")
    finally:
        if launcher.poll() is None:
            launcher.kill()
            launcher.wait()
        for pid in filter(_alive, ranks):  # only when the test failed: leave nothing running
            os.kill(pid, signal.SIGKILL)
