"""What validate-gpu's agent probes found (`_agent_probes`), and their checks. Pure: no torch.

Three questions a GPU answers about the agent against the job's own CUDA-event timing:
- does the agent's step MFU equal a bf16 GEMM chain's known FLOPs over its event-timed period;
- do the buckets of a step with a known shape (GEMMs, a host sleep during which the device
  idles, a world-size-1 NCCL all_reduce, each timed by events) come out of the profiled window's
  steps, and of the steps carried between windows, as the events measured them;
- what does the agent cost the training thread per step on the device path, against the least
  any step timer on a GPU costs (`hot_path_probe.DeviceFloor`), and does a steady boundary run
  only what the hot-path contract allows (the contract tests' probe, on the device)?
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

__all__ = [
    "AGENT_CHECK_NAMES",
    "BreakdownProbe",
    "CostProbe",
    "MfuProbe",
    "Shares",
    "agent_checks",
]

MFU_TOLERANCE = 0.02  # relative: the agent's MFU / the events' MFU within 1 +- this
BREAKDOWN_TOLERANCE = 0.04  # 4 points: each bucket's share of the step
MAX_COST_RATIO = 2.0  # the agent's median per step / the device floor's
MAX_COST_P99_S = 100e-6


@dataclass(frozen=True)
class MfuProbe:
    """Steps of a bf16 GEMM chain of `known_flops` each (2 n^3 per GEMM): the median MFU from
    the CUDA events around each step (`truth_mfu`) and from the agent's reports (`agent_mfu`),
    over `steps` steps after warm-up; `counted_flops`: the agent's FLOPs of its median step."""

    steps: int
    known_flops: float
    counted_flops: float
    peak_flops: float
    truth_mfu: float
    agent_mfu: float


@dataclass(frozen=True)
class Shares:
    """A step's buckets as shares of its wall time: compute (recompute included), exposed
    communication, idle (bubble, and the profiler's own `instrumentation` on a window step)."""

    compute: float
    exposed_comm: float
    idle: float

    def error(self, other: Shares) -> float:
        """The largest difference of one bucket's share (a ratio: 0.04 is 4 points)."""
        return max(
            abs(self.compute - other.compute),
            abs(self.exposed_comm - other.exposed_comm),
            abs(self.idle - other.idle),
        )


@dataclass(frozen=True)
class BreakdownProbe:
    """Steps of a known shape timed by CUDA events (`truth`: the median step's shares) against
    the agent's reports: its profiled window's steps and the steps it carried after the window
    (medians, and the largest error of any one step against that step's own events)."""

    truth: Shares
    window: Shares | None
    carried: Shares | None
    window_steps: int
    carried_steps: int
    window_error: float
    carried_error: float


@dataclass(frozen=True)
class CostProbe:
    """Seconds per step inside the instrumentation on the device path (`steps` steps per mode,
    interleaved): `Floor` (one timestamp), `DeviceFloor` (the same and one event recorded at each
    boundary), `with agent.step():` and `agent.mark_step()`. `calls`: what a steady boundary ran
    on the training thread; `unexpected`: how it differs from the contract ("" when it does
    not)."""

    steps: int
    floor_s: float
    device_floor_s: float
    step_median_s: float
    step_p99_s: float
    mark_median_s: float
    mark_p99_s: float
    calls: str
    unexpected: str


@dataclass(frozen=True)
class AgentCheck:
    name: str
    ok: bool
    measured: str
    expected: str


AGENT_CHECK_NAMES = (
    "MFU vs CUDA-event ground truth",
    "window breakdown vs CUDA events",
    "carried breakdown vs CUDA events",
    "agent cost per step (device path)",
    "hot path calls on the device",
)


def _pct(share: float) -> str:
    return f"{share * 100:.1f}%"


def _shares(s: Shares | None) -> str:
    if s is None:
        return "none"
    return f"compute {_pct(s.compute)}, comm {_pct(s.exposed_comm)}, idle {_pct(s.idle)}"


def _mfu_check(p: MfuProbe) -> AgentCheck:
    ratio = p.agent_mfu / p.truth_mfu if p.truth_mfu > 0 else float("inf")
    return AgentCheck(
        AGENT_CHECK_NAMES[0],
        abs(ratio - 1) <= MFU_TOLERANCE,
        f"agent {p.agent_mfu:.4f} / events {p.truth_mfu:.4f} = {ratio:.4f} over {p.steps} steps "
        f"(FLOPs counted {p.counted_flops:.4g} of {p.known_flops:.4g})",
        f"1 +- {MFU_TOLERANCE}",
    )


def _breakdown_checks(p: BreakdownProbe) -> list[AgentCheck]:
    expected = f"each bucket within {BREAKDOWN_TOLERANCE * 100:.0f} points of the events, per step"
    return [
        AgentCheck(
            AGENT_CHECK_NAMES[1],
            p.window_steps > 0 and p.window_error <= BREAKDOWN_TOLERANCE,
            f"{p.window_steps} steps, worst {p.window_error * 100:.2f} points; agent "
            f"{_shares(p.window)}; events {_shares(p.truth)}",
            expected,
        ),
        AgentCheck(
            AGENT_CHECK_NAMES[2],
            p.carried_steps > 0 and p.carried_error <= BREAKDOWN_TOLERANCE,
            f"{p.carried_steps} steps, worst {p.carried_error * 100:.2f} points; agent "
            f"{_shares(p.carried)}; events {_shares(p.truth)}",
            expected,
        ),
    ]


def _cost_checks(p: CostProbe) -> list[AgentCheck]:
    worst = max(p.step_median_s, p.mark_median_s) / p.device_floor_s
    p99 = max(p.step_p99_s, p.mark_p99_s)
    us = 1e6
    return [
        AgentCheck(
            AGENT_CHECK_NAMES[3],
            worst <= MAX_COST_RATIO and p99 <= MAX_COST_P99_S,
            f"median with-step {p.step_median_s * us:.2f} us, marker {p.mark_median_s * us:.2f} "
            f"us; device floor {p.device_floor_s * us:.2f} us (x{worst:.2f}), timestamp floor "
            f"{p.floor_s * us:.2f} us; p99 {p99 * us:.1f} us; {p.steps} steps per mode",
            f"<= {MAX_COST_RATIO} x the device floor, p99 <= {MAX_COST_P99_S * us:.0f} us",
        ),
        AgentCheck(
            AGENT_CHECK_NAMES[4],
            not p.unexpected,
            p.unexpected or p.calls,
            "the clock, a pooled event and its record per boundary (the contract tests' list)",
        ),
    ]


def agent_checks(
    mfu: MfuProbe | None,
    breakdown: BreakdownProbe | None,
    cost: CostProbe | None,
    errors: Mapping[str, str],
) -> list[AgentCheck]:
    """The checks of the three probes (failed, with the probe's error, when one did not run)."""
    out: list[AgentCheck] = []
    if mfu is None:
        why = errors.get("MFU ground truth", "not run")
        out.append(AgentCheck(AGENT_CHECK_NAMES[0], False, why, ""))
    else:
        out.append(_mfu_check(mfu))
    if breakdown is None:
        why = errors.get("breakdown", "not run")
        out += [AgentCheck(n, False, why, "") for n in AGENT_CHECK_NAMES[1:3]]
    else:
        out += _breakdown_checks(breakdown)
    if cost is None:
        why = errors.get("hot path cost", "not run")
        out += [AgentCheck(n, False, why, "") for n in AGENT_CHECK_NAMES[3:]]
    else:
        out += _cost_checks(cost)
    return out
