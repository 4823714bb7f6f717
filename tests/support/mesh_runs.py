"""Running `tests/support/mesh_job.py` under torchrun, and reading a collector's series, for the
collective-records integration tests."""

from __future__ import annotations

import os
import re
import sys
import urllib.request
from pathlib import Path

__all__ = ["mesh_job", "scrape"]

SUPPORT = Path(__file__).resolve().parent
ROOT = SUPPORT.parents[1]
_SAMPLE = re.compile(r"^(\w+)\{([^}]*)\} (\S+)$")


def mesh_job(tmp_path: Path, ranks: int, *args: str) -> tuple[list[str], dict[str, str]]:
    """The command and environment that run the job on `ranks` gloo ranks with `args`; the
    environment leaves out the caller's agent options and flight-recorder size."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MFUSCOPE_", "TORCH_FR"))}
    env.update(OMP_NUM_THREADS="1", TMPDIR=str(tmp_path), PYTHONPATH=str(ROOT))
    command = [
        str(Path(sys.executable).parent / "torchrun"),
        "--standalone",
        f"--nproc_per_node={ranks}",
        str(SUPPORT / "mesh_job.py"),
        *args,
    ]
    return command, env


def scrape(url: str, name: str) -> list[tuple[dict[str, str], float]]:
    """The samples of metric `name` on a collector's /metrics: (labels, value)."""
    with urllib.request.urlopen(url + "/metrics", timeout=30) as response:
        lines = response.read().decode().splitlines()
    found = []
    for line in lines:
        match = _SAMPLE.match(line)
        if match and match.group(1) == name:
            labels = dict(re.findall(r'(\w+)="([^"]*)"', match.group(2)))
            found.append((labels, float(match.group(3))))
    return found
