"""What the agent says in the job's log: one line at start (rank 0), one per analysed window.

- At start, rank 0 logs at INFO where its figures come from: the peak and its source, where the
  reports go, and the profiled-window schedule every rank follows.
- After each profiled window, the analyser thread logs the window's buckets (INFO on rank 0,
  DEBUG on the other ranks, which say the same about their own steps). Nothing here runs on the
  training thread per step.
- An application that has configured no logging at all would never see an INFO line (Python
  prints only warnings then), so `ensure_visible` gives the `mfuscope.agent` logger a handler that
  prints its INFO lines to stderr until the application configures logging, and from then on
  hands each record to the root logger as propagation would.
- PyTorch's profiler backend (Kineto) prints ``USDT: ... profiler_start`` / ``profiler_stop`` to
  stderr at every profiler start and stop, at a severity above all its others, so only
  ``KINETO_LOG_LEVEL`` above it (6) silences them (Kineto's ``LOG_IS_ON(severity)`` is
  ``severity >= KINETO_LOG_LEVEL``; ``USDT_EMIT_START_TRACE`` logs at the USDT severity, in
  kineto's libkineto/src/Logger.h). Kineto reads the variable once, when the process first
  starts a profiler; `quiet_kineto` sets it then unless the user has set it.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Callable, MutableMapping, Sequence
from typing import TYPE_CHECKING

from mfuscope.core.step_report import DecompositionLike, carried_breakdown

if TYPE_CHECKING:
    from mfuscope.agent.config import AgentConfig

__all__ = [
    "KINETO_LOG_LEVEL",
    "KINETO_QUIET_LEVEL",
    "ensure_visible",
    "quiet_kineto",
    "startup_line",
    "window_line",
]

KINETO_LOG_LEVEL = "KINETO_LOG_LEVEL"
# Above Kineto's USDT severity (5; ERROR is 4): nothing of Kineto's is printed.
KINETO_QUIET_LEVEL = "6"

_PEAK_SOURCES = {
    "spec": "from the datasheet table",
    "measured": "measured by a CPU matmul calibration",
    "user": "given",
}


def quiet_kineto(environ: MutableMapping[str, str] | None = None) -> bool:
    """Silence Kineto's per-window stderr lines unless the user chose a level; True when set."""
    env = os.environ if environ is None else environ
    if KINETO_LOG_LEVEL in env:
        return False
    env[KINETO_LOG_LEVEL] = KINETO_QUIET_LEVEL
    return True


class _UntilConfigured(logging.StreamHandler):  # type: ignore[type-arg]
    """Prints records while the root logger has no handler; once the application configures
    logging, hands them to the root logger (at the root's level) instead."""

    def handle(self, record: logging.LogRecord) -> bool:
        root = logging.getLogger()
        if root.handlers:
            if record.levelno >= root.getEffectiveLevel():
                root.handle(record)
            return True
        return bool(super().handle(record))


def ensure_visible(logger: logging.Logger) -> None:
    """Let `logger`'s INFO lines reach stderr when the application has configured no logging."""
    if logger.handlers or logger.level != logging.NOTSET or logging.getLogger().handlers:
        return
    handler = _UntilConfigured(sys.stderr)
    handler.setFormatter(logging.Formatter("%(message)s"))
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False


def _peak_words(peak_flops: float | None, source: str, device: str, note: str = "") -> str:
    if peak_flops is None:
        return f"peak FLOP/s of {device!r} unknown: MFU not computed (pass peak_flops=...)"
    scale, prefix = next(
        ((f, p) for f, p in ((1e15, "P"), (1e12, "T"), (1e9, "G")) if peak_flops >= f), (1e6, "M")
    )
    rate = f"{peak_flops / scale:.4g} {prefix}FLOP/s"
    words = f"peak {rate} per device {_PEAK_SOURCES.get(source, source)}"
    return f"{words} ({note})" if note else words


def _destinations(config: AgentConfig) -> str:
    places = []
    if config.collector_url:
        places.append(f"collector {config.collector_url}")
    if config.jsonl_path:
        places.append(f"JSONL {config.jsonl_path}")
    return " and ".join(places) if places else "nowhere (no collector_url or jsonl_path)"


def _schedule_words(config: AgentConfig) -> str:
    if not config.profile:
        return "no profiled windows (profile=0): no step breakdown"
    return (
        f"profiled windows of {config.profile_steps} steps from step "
        f"{config.first_step + config.profile_first_step}, then every "
        f"{config.profile_every_steps} steps or {config.profile_every_s:g} s, whichever comes "
        f"first (at most {config.profile_max_overhead_ratio:.2%} of the time); the steps between "
        "windows carry the latest window's breakdown"
    )


def startup_line(
    config: AgentConfig,
    *,
    world_size: int,
    device: str,
    peak_flops: float | None,
    peak_source: str,
    peak_note: str = "",
) -> str:
    """The agent's start-up line (rank 0's options are the ones every rank follows)."""
    return (
        f"mfuscope: agent started for job {config.job!r} on {world_size} "
        f"rank{'s' * (world_size != 1)} ({device}); "
        f"{_peak_words(peak_flops, peak_source, device, peak_note)}; "
        f"reports to {_destinations(config)}; "
        f"{_schedule_words(config)}"
    )


def window_line(steps: Sequence[int], decompositions: Sequence[DecompositionLike]) -> str | None:
    """One line for an analysed window: its steps and its buckets (None without a breakdown)."""
    breakdown = carried_breakdown(decompositions, max(steps)) if decompositions else None
    if breakdown is None:
        return None
    exposed = [s for s in breakdown.shares if s.component == "exposed_comm"]
    parts = [
        f"{s.component.replace('_', ' ')} {s.fraction:.1%}"
        for s in breakdown.shares
        if s.component != "exposed_comm"
    ]
    if exposed:
        split = ", ".join(f"{s.axis}/{s.tier} {s.fraction:.1%}" for s in exposed)
        parts.append(f"exposed comm {sum(s.fraction for s in exposed):.1%} ({split})")
    first, last = min(steps), max(steps)
    return (
        f"mfuscope: profiled window, steps {first}-{last}, analysed: {', '.join(parts)}; "
        "later steps carry this breakdown until the next window"
    )


def window_logger(
    logger: logging.Logger, rank: int
) -> Callable[[Sequence[int], Sequence[DecompositionLike]], None]:
    """A callback for the analyser thread: logs `window_line` (INFO on rank 0, else DEBUG);
    never raises."""
    level = logging.INFO if rank == 0 else logging.DEBUG

    def log(steps: Sequence[int], decompositions: Sequence[DecompositionLike]) -> None:
        try:
            if logger.isEnabledFor(level):
                line = window_line(steps, decompositions)
                if line is not None:
                    logger.log(level, line)
        except Exception:  # a broken handler or odd result must not stop the analyser
            return

    return log
