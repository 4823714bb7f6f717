"""Carried GPU steps against a model of GPU steps that knows its own truth.

    .venv/bin/python benchmarks/gpu_carried.py [--steps 300] [--every 60] [--window 3]
        [--read-every 5] [--seeds 1]

`tests/support/gpu_step_model.py` simulates 2 data-parallel ranks (a compute stream, a
communication stream, bucketed all_reduces hidden under the backward, the optimizer waiting for
the last one) in each case, and writes what a real rank leaves: a Kineto trace of each profiled
window and a flight-recorder entry with its duration for every all_reduce.
`tests/support/gpu_step_agent.py` drives the agent's own report path with them (its step reports,
report assembly, collective reader, and window analysis on the trace files), profiling `--window`
steps every `--every` steps from step 10 and reading the recorder every `--read-every` seconds of
model time.

Per case and rank, exposed communication of the carried steps (every step between windows, after
the first window's analysis is in) minus the model's truth, in points (percent of a step): over
their summed time (what a ratio of counters is off by), mean |error| per step and the worst step:

- *before*: the recorder without durations (NCCL timing off): the window's shares, as every GPU
  step carried them until now;
- *after*: with durations, what the agent carries (docs/definitions.md#carried-breakdowns);
- *(a)*, *(b)*: the candidates it was chosen against, computed here from the same window (as the
  engine analysed it) and the same per-step durations: (a) the window's hidden seconds stay hidden,
  the rest of the step's collective time is exposed; (b) the step's collective time times the
  window's exposed fraction.

All of it runs in model time: the figures do not depend on the machine's load.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from mfuscope.agent._runtime import _Device, _engine_analyse
from mfuscope.core.carried_durations import WindowSeconds, window_seconds
from mfuscope.core.step_report import carried_steps

from tests.support.gpu_step_agent import (
    DEVICE,
    AgentRun,
    CarriedError,
    carried_errors,
    model_topology,
    run_rank,
    window_steps,
)
from tests.support.gpu_step_model import CASES, ModelRank, StepShape, simulate, window_trace

Rule = Callable[[WindowSeconds, float], float]  # (window, the step's collective seconds) -> exposed


def _hidden_stays(window: WindowSeconds, took: float) -> float:
    """(a): the window's hidden seconds stay hidden, the rest is exposed."""
    (known,) = window.classes
    return max(took - known.hidden_s, 0.0)


def _exposed_fraction(window: WindowSeconds, took: float) -> float:
    """(b): the window's exposed fraction of the class's time."""
    (known,) = window.classes
    return took * (known.seconds - known.hidden_s) / known.seconds


def _windows(rank: ModelRank, profiled: list[int], shape: StepShape) -> dict[int, WindowSeconds]:
    """Each window's seconds as the agent computes them, by the window's last step."""
    device = _Device(DEVICE, True, None)
    analyse = _engine_analyse(model_topology(rank.rank), device, lambda path: None, None)
    groups: list[list[int]] = []
    for step in profiled:
        if groups and groups[-1][-1] == step - 1:
            groups[-1].append(step)
        else:
            groups.append([step])
    out = {}
    with tempfile.TemporaryDirectory() as tmp:
        for group in groups:
            path = Path(tmp) / "window.json"
            path.write_text(json.dumps(window_trace(rank, group, shape)))
            seconds = window_seconds(
                carried_steps(sorted(analyse(str(path)), key=lambda s: s.step))
            )
            assert seconds is not None
            out[group[-1]] = seconds
    return out


def _candidate(run: AgentRun, rank: ModelRank, shape: StepShape, rule: Rule) -> CarriedError:
    windows = _windows(rank, run.windows, shape)
    pad_s = 2 * shape.fr_pad_us / 1e6
    errors, wall, diff = [], 0.0, 0.0
    for step, report in sorted(run.reports.items()):
        if report.breakdown_step is None or step in run.windows:
            continue
        model = rank.steps[step]
        assert model.truth is not None
        took = sum(length / 1e6 + pad_s for _, length, _ in model.comms)
        got = rule(windows[report.breakdown_step], took)
        errors.append(100 * (got - model.truth.exposed_comm_s) / report.wall_s)
        wall += report.wall_s
        diff += got - model.truth.exposed_comm_s
    return CarriedError(
        len(errors), 100 * diff / wall, statistics.fmean(map(abs, errors)), max(errors, key=abs)
    )


def _stalled_idle(run: AgentRun, rank: ModelRank) -> list[float]:
    """Carried bubble_idle minus the model's on the carried steps the model has over 10 ms
    idle (a data stall or a late host before the next step), in points."""
    errors = []
    for step, report in sorted(run.reports.items()):
        truth = rank.steps[step].truth
        if report.breakdown_step is None or step in run.windows or truth is None:
            continue
        if truth.idle_s > 0.01:
            idle = sum(c.seconds for c in report.components if c.component == "bubble_idle")
            errors.append(100 * (idle - truth.idle_s) / report.wall_s)
    return errors


def _cell(error: CarriedError) -> str:
    return f"{error.by_time:+5.1f} {error.mean_abs:4.1f} {error.worst:+6.1f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--every", type=int, default=60)
    parser.add_argument("--window", type=int, default=3)
    parser.add_argument("--read-every", type=float, default=5.0, help="seconds of model time")
    parser.add_argument("--seeds", type=int, default=1, help="model seeds (kernel jitter)")
    args = parser.parse_args()
    profiled = window_steps(args.steps, every=args.every, size=args.window)
    columns = ("before", "after", "(a)", "(b)")
    print("points of a step: by time, mean |error|, worst step")
    print(f"{'case':46} seed rank | " + " | ".join(f"{c:^17}" for c in columns))
    found: dict[str, list[CarriedError]] = {c: [] for c in columns}
    stalled: dict[str, list[float]] = {"before": [], "after": []}
    for seed in range(args.seeds):
        for case in CASES:
            for rank in simulate(case, args.steps, seed=seed):
                before, after = (
                    run_rank(
                        rank, case.shape, timed=t, windows=profiled, read_every_s=args.read_every
                    )
                    for t in (False, True)
                )
                row = (
                    carried_errors(before, rank),
                    carried_errors(after, rank),
                    _candidate(after, rank, case.shape, _hidden_stays),
                    _candidate(after, rank, case.shape, _exposed_fraction),
                )
                stalled["before"] += _stalled_idle(before, rank)
                stalled["after"] += _stalled_idle(after, rank)
                for column, error in zip(columns, row, strict=True):
                    found[column].append(error)
                cells = " | ".join(_cell(e) for e in row)
                print(f"{case.name:46} {seed:4} {rank.rank:4} | {cells}", flush=True)
    print()
    print("rule | rank-runs within 4 points by time | worst step within 4 | mean |error| | largest")
    for column, errors in found.items():
        by_time = sum(abs(e.by_time) <= 4 for e in errors)
        worst = sum(abs(e.worst) <= 4 for e in errors)
        mean = statistics.fmean(e.mean_abs for e in errors)
        largest = max((e.worst for e in errors), key=abs)
        n = len(errors)
        print(f"{column} | {by_time} of {n} | {worst} of {n} | {mean:.2f} | {largest:+.1f}")
    print()
    for column, errors in stalled.items():
        print(
            f"bubble_idle of the {len(errors)} carried steps the model has over 10 ms idle, "
            f"{column}: from {min(errors):+.1f} to {max(errors):+.1f} points"
        )


if __name__ == "__main__":
    main()
