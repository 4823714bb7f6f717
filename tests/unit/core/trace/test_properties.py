"""Hypothesis properties of the decomposition against a brute-force oracle.

The oracle below is written from docs/definitions.md#step-buckets and the step-window rule of
docs/analyze.md only: it walks every microsecond of every window (all synthetic times are whole
microseconds, so classifying the midpoint of each microsecond is exact) and never touches the
engine's code.
"""

from __future__ import annotations

import copy
import math
import random
from collections import defaultdict
from dataclasses import dataclass

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from mfuscope.core.bandwidth import LinkModel, bus_factor
from mfuscope.core.trace import AnalysisOptions, RankAnalysis, analyze_trace

from tests.support.trace_builder import Group, TraceBuilder, TruthEvent
from tests.support.trace_strategies import synthetic

LINKS = {
    "intra_node": LinkModel(alpha_s=1e-6, beta_bytes_per_s=1e9),  # 1 µs + 1 µs per kB
    "inter_node": LinkModel(alpha_s=5e-6, beta_bytes_per_s=1e8),
}
AXIS_OF_DESC = {"mesh_tp": "tp", "mesh_dp": "dp", "mesh_pp": "pp", "default_pg": "world"}
TOL = 1e-9


def tier_of(group: Group) -> str:
    return "intra_node" if len({r // 8 for r in group.ranks}) == 1 else "inter_node"


@dataclass
class Expected:
    step: int
    start: float
    end: float
    buckets: dict[str, float]
    exposed: dict[tuple[str, str], float]
    records: list[tuple[str, str, str, int, int | None, float, float]]


def oracle(
    truth: list[TruthEvent], steps: list[tuple[int, float, float]], links: dict[str, LinkModel]
) -> list[Expected]:
    # Step windows: first device event launched inside the CPU step, to the next such start.
    live = []
    ordered = sorted(steps, key=lambda x: x[1])

    def step_of(launch: float) -> int | None:
        # The latest step starting at or before the launch, if the launch is not past its end.
        candidates = [n for n, s, _ in ordered if s <= launch]
        if not candidates:
            return None
        number = candidates[-1]
        end = next(e for n, _, e in ordered if n == number)
        return number if launch <= end else None

    for number, _, _ in ordered:
        launched = [t for t in truth if t.launch is not None and step_of(t.launch) == number]
        if launched:
            live.append((number, min(t.start for t in launched), max(t.end for t in launched)))
    windows = []
    previous_end = -math.inf
    for i, (number, first, last) in enumerate(live):
        start = max(first, previous_end)
        end = live[i + 1][1] if i + 1 < len(live) else last
        if end > start:
            windows.append((number, start, end))
            previous_end = end

    comms = [t for t in truth if t.kind == "comm"]
    ideal_left = {}
    for c in comms:
        if c.op in ("send", "recv") and c.group is not None and c.group.desc == "mesh_pp":
            ideal_left[id(c)] = (
                links[tier_of(c.group)].alpha_s + c.bytes / links[tier_of(c.group)].beta_bytes_per_s
            ) * 1e6
    overlapped = defaultdict(float)
    horizon = max([t.end for t in truth], default=0.0)
    origin = min([t.start for t in truth], default=0.0)
    in_window = {}
    for w, (_, s, e) in enumerate(windows):
        for us in range(int(s), int(e)):
            in_window[us] = w
    out = [Expected(n, s, e, defaultdict(float), defaultdict(float), []) for n, s, e in windows]
    for us in range(int(origin), int(horizon) + 1):
        mid = us + 0.5
        active = [t for t in truth if t.start <= mid < t.end]
        kinds = {t.kind for t in active}
        busy = "compute" in kinds or "recompute" in kinds
        comm_now = [t for t in active if t.kind == "comm"]
        for c in comm_now:
            if busy:
                overlapped[id(c)] += 1.0
        w = in_window.get(us)
        if w is None:
            continue
        b = out[w].buckets
        if "compute" in kinds:
            b["compute"] += 1
        elif "recompute" in kinds:
            b["recompute"] += 1
        elif comm_now:
            share = 1.0 / len(comm_now)
            for c in comm_now:
                axis = AXIS_OF_DESC[c.group.desc] if c.group else "unknown"
                tier = tier_of(c.group) if c.group else "unknown"
                if id(c) in ideal_left:
                    as_comm = min(share, ideal_left[id(c)])
                    ideal_left[id(c)] -= as_comm
                    b["bubble_pipeline"] += share - as_comm
                    if as_comm > 0:
                        out[w].exposed[(axis, tier)] += as_comm
                else:
                    out[w].exposed[(axis, tier)] += share
        elif "other" in kinds:
            b["other"] += 1
        else:
            b["bubble_idle"] += 1
    for w, (_, s, e) in enumerate(windows):
        for c in sorted(comms, key=lambda c: (c.start, c.end)):
            if not (s <= c.start < e) or c.op is None or c.op == "barrier":
                continue
            dur = c.end - c.start
            group = c.group
            out[w].records.append(
                (
                    c.op,
                    AXIS_OF_DESC[group.desc] if group else "unknown",
                    tier_of(group) if group else "unknown",
                    group.size if group else 16,
                    c.bytes,
                    dur,
                    overlapped[id(c)] / dur,
                )
            )
    return out


def close(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=TOL, abs_tol=TOL)


def assert_matches(result: RankAnalysis, expected: list[Expected]) -> None:
    assert [s.step for s in result.steps] == [e.step for e in expected]
    for got, exp in zip(result.steps, expected, strict=True):
        us = 1e-6
        assert close(got.wall_s, (exp.end - exp.start) * us)
        assert close(got.start_s, exp.start * us + 1.7e9)
        for name in ("compute", "recompute", "other", "bubble_pipeline", "bubble_idle"):
            assert close(getattr(got, f"{name}_s"), exp.buckets[name] * us), name
        exposed = {(e.axis, e.tier): e.seconds for e in got.exposed_comm}
        assert set(exposed) == {k for k, v in exp.exposed.items() if v > 0}
        for key, seconds in exposed.items():
            assert close(seconds, exp.exposed[key] * us), key
        records = [
            (c.op, c.axis, c.tier, c.group_size, c.bytes, c.seconds / us, c.overlapped_ratio)
            for c in got.collectives
        ]
        assert len(records) == len(exp.records)

        def key(r: tuple[str, str, str, int, int | None, float, float]) -> tuple[object, ...]:
            return (r[5], r[0], r[1], r[2], r[3], -1 if r[4] is None else r[4], r[6])

        # Same order up to ties between identical intervals.
        for r, e in zip(sorted(records, key=key), sorted(exp.records, key=key), strict=True):
            assert r[:5] == e[:5]
            assert close(r[5], e[5]) and close(r[6], e[6])
        total = got.compute_s + got.recompute_s + got.exposed_comm_s + got.other_s + got.bubble_s
        assert close(total, got.wall_s)
        assert close(got.bubble_s, got.bubble_pipeline_s + got.bubble_idle_s)
        for c in got.collectives:
            if c.bytes is not None:
                assert c.busbw_bytes_per_s is not None
                assert close(
                    c.busbw_bytes_per_s, c.bytes / c.seconds * bus_factor(c.op, c.group_size)
                )


def _analyse(trace: dict, links: dict[str, LinkModel] | None = LINKS, **kw: float) -> RankAnalysis:
    return analyze_trace(trace, AnalysisOptions(links=links, **kw))


def _has_window(b: TraceBuilder) -> bool:
    return any(
        t.launch is not None and any(s <= t.launch <= e for _, s, e in b.steps) for t in b.truth
    )


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(synthetic())
def test_engine_matches_brute_force_oracle(b: TraceBuilder) -> None:
    trace = b.build()
    if not _has_window(b):
        return
    result = _analyse(trace)
    assert_matches(result, oracle(b.truth, b.steps, LINKS))


@settings(max_examples=60, deadline=None)
@given(synthetic(), st.randoms(use_true_random=False))
def test_result_does_not_depend_on_event_order(b: TraceBuilder, rnd: random.Random) -> None:
    if not _has_window(b):
        return
    trace = b.build()
    shuffled = dict(trace, traceEvents=rnd.sample(trace["traceEvents"], len(trace["traceEvents"])))
    assert _analyse(trace) == _analyse(shuffled)


@settings(max_examples=60, deadline=None)
@given(
    synthetic(),
    st.floats(0.0, 1e15),
    st.floats(0.0, 1e15),
    st.floats(1e12, 1e16),
)
def test_mfu_never_exceeds_hfu_and_input_is_untouched(
    b: TraceBuilder, model: float, recompute: float, peak: float
) -> None:
    if not _has_window(b):
        return
    trace = b.build()
    before = copy.deepcopy(trace)
    result = _analyse(
        trace,
        model_flops_per_step=model,
        recompute_flops_per_step=recompute,
        peak_flops=peak,
    )
    assert trace == before
    for step in result.steps:
        assert step.mfu is not None and step.hfu is not None
        assert step.mfu <= step.hfu
        assert close(step.mfu, model / (peak * step.wall_s))


@settings(max_examples=60, deadline=None)
@given(synthetic())
def test_without_link_models_exposed_pipeline_p2p_is_all_bubble(b: TraceBuilder) -> None:
    if not _has_window(b):
        return
    no_links = {k: LinkModel(alpha_s=1e3, beta_bytes_per_s=1e-3) for k in LINKS}  # ideal: forever
    with_huge_ideal = _analyse(b.build(), links=no_links)
    without = _analyse(b.build(), links=None)
    for a, c in zip(with_huge_ideal.steps, without.steps, strict=True):
        # Without links the exposed pp p2p time is all pipeline bubble; with an ideal time
        # longer than any transfer it is all communication on the pp axis.
        assert a.bubble_pipeline_s == 0.0
        pp_with = sum(e.seconds for e in a.exposed_comm if e.axis == "pp")
        pp_without = sum(e.seconds for e in c.exposed_comm if e.axis == "pp")
        assert close(pp_with - pp_without, c.bubble_pipeline_s)
        assert close(a.exposed_comm_s + a.bubble_pipeline_s, c.exposed_comm_s + c.bubble_pipeline_s)
