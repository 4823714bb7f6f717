"""How many profiled windows land on the same steps on every rank, on the gloo job of the tests.

    .venv/bin/python benchmarks/window_alignment.py [--nproc 2] [--steps 120] [--out DIR]

Runs `tests/support/agent_job.py` on N ranks started by `tests/support/launch.py` with short
windows (first at step 3, 2 steps each, every 8 steps or 2 s, a 20% overhead budget, so the
measured window costs set the gaps), each rank writing its reports to a JSONL file. A rank's
profiled steps are the steps whose report carries its own decomposition (`breakdown_step ==
step`); a window is a run of consecutive profiled steps. Printed: each rank's window starts and
how many distinct windows were taken on the same steps by every rank. Options are the agent's
own, so the same command measures any version of the agent.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from mfuscope.core.schema import decode_batch  # noqa: E402

from tests.support import agent_helpers  # noqa: E402

WINDOW_STEPS = 2
OPTIONS = {
    "profile_first_step": 3,
    "profile_steps": WINDOW_STEPS,
    "profile_every_steps": 8,
    "profile_every_s": 2,
    "profile_max_overhead_ratio": 0.2,
    "calibrate_cpu_peak": 0,
    "peak_flops": 1e12,
    "flush_interval_s": 0.5,
}


def windows_of(jsonl: Path) -> list[tuple[int, ...]]:
    """The profiled windows in one rank's report file, as tuples of steps."""
    steps = sorted(
        {
            report.step
            for line in jsonl.read_text().splitlines()
            for report in decode_batch(line).reports
            if report.breakdown_step == report.step
        }
    )
    starts = [s for i, s in enumerate(steps) if i == 0 or steps[i - 1] != s - 1]
    return [tuple(s for s in steps if start <= s < start + WINDOW_STEPS) for start in starts]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nproc", type=int, default=2)
    parser.add_argument("--steps", type=int, default=120)
    parser.add_argument("--out", type=Path, help="where the reports go (default: a temp dir)")
    args = parser.parse_args()
    out = args.out or Path(tempfile.mkdtemp(prefix="mfuscope-windows-"))
    out.mkdir(parents=True, exist_ok=True)
    jsonl = out / "reports{rank}.jsonl"
    options = [item for k, v in OPTIONS.items() for item in ("--option", f"{k}={v}")]
    command, env = agent_helpers.job_command(
        out, "--steps", str(args.steps), "--jsonl", str(jsonl), "--close-timeout-s", "60", *options
    )
    command = [c.replace("--nproc_per_node=2", f"--nproc_per_node={args.nproc}") for c in command]
    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=900)
    if result.returncode != 0:
        sys.exit(f"the job failed:\n{result.stderr[-3000:]}")
    windows = {
        rank: windows_of(Path(str(jsonl).replace("{rank}", str(rank))))
        for rank in range(args.nproc)
    }
    for rank, taken in windows.items():
        print(f"rank {rank}: {len(taken)} windows, starts {[w[0] for w in taken]}")
    sets = [set(taken) for taken in windows.values()]
    common, union = set.intersection(*sets), set.union(*sets)
    print(
        f"windows on the same steps on all {args.nproc} ranks: {len(common)} of {len(union)} "
        f"distinct windows ({args.steps} steps, reports in {out})"
    )


if __name__ == "__main__":
    main()
