"""Pure parts of `mfuscope demo`: the live view, process trees from /proc, the Prometheus config."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from mfuscope.cli.demo._agent_tail import AgentTail
from mfuscope.cli.demo._live_view import (
    BUCKET_STYLES,
    DemoState,
    breakdown_line,
    decomposition_bar,
    render,
    status_line,
    straggler_text,
)
from mfuscope.cli.demo._procs import process_tree
from mfuscope.cli.demo._services import ServiceError, project_prometheus_dir, prometheus_config
from mfuscope.core.schema import ComponentShare, ReportBatch, StepReport, encode_batch
from rich.console import Console

SUMMARY: dict[str, Any] = {
    "job": "demo",
    "ranks": 2,
    "world_size": 2,
    "window_steps": 20,
    "mfu": 0.3812,
    "hfu": 0.4231,
    "peak_flops": 1.9e11,
    "peak_unknown_ranks": 0,
    "components": {"compute": 0.55, "recompute": 0.12, "exposed_comm": 0.2, "bubble_idle": 0.13},
    "exposed_comm": [{"axis": "dp", "tier": "intra_node", "fraction": 0.2}],
    "collectives": [
        {"op": "all_reduce", "axis": "dp", "tier": "intra_node", "calls": 4, "bytes": 2.0e6,
         "seconds": 0.05, "busbw_bytes_per_s": 4.0e7, "efficiency": 0.0013}
    ],
    "stragglers": [{"rank": 1, "ratio": 1.04, "step_s": 0.07}],
    "straggler_basis": "self",
    "reports": {"accepted": 240, "duplicates": 0, "dropped_by_agents": 0},
    "agent_health": {"send_failures_total": 0},
    "effective_mfu": 0.2904,
    "job_time_s": {"startup": 6.0, "step": 40.0, "checkpoint_save": 4.0, "down": 0.0},
}  # fmt: skip


def _state(summary: dict[str, Any] | None) -> DemoState:
    return DemoState(
        job="demo",
        mode="data parallel (dp), 2 ranks, gloo",
        steps_target=100,
        metrics_url="http://127.0.0.1:9464/metrics",
        phase="training",
        elapsed_s=12.0,
        step=41,
        loss=1.62,
        loss_floor=1.386,
        summary=summary,
        notes=["torch imported in 1.3 s"],
    )


def _text(state: DemoState) -> str:
    console = Console(width=120, record=True, force_terminal=False)
    console.print(render(state))
    return console.export_text()


def test_status_line_carries_mfu_hfu_buckets_and_reports() -> None:
    line = status_line(_state(SUMMARY))
    assert "step 42/100" in line and "loss 1.620 (floor 1.386)" in line
    assert "MFU 38.1% HFU 42.3% effective MFU 29.0%" in line
    assert "compute 55.0% recompute 12.0% exposed comm 20.0% idle 13.0%" in line
    assert "reports 240 from 2/2 ranks, dropped 0" in line
    assert "MFU" not in status_line(_state(None))


def test_render_shows_every_part_of_the_summary() -> None:
    text = _text(_state(SUMMARY))
    for expected in (
        "38.1% / 42.3%",
        "29.0%   of every rank-second: step 80.0%, startup 12.0%, checkpoint_save 8.0%",
        "http://127.0.0.1:9464/metrics",
        "exposed comm by axis/tier",
        "all_reduce",
        "500 kB",  # mean size: 2 MB over 4 calls
        "40 MB/s",
        "none above ×1.20 (slowest rank 1 ×1.04, own time, last 20 steps)",
        "240 accepted",
        "torch imported",
    ):
        assert expected in text, expected
    waiting = _text(_state(None))
    assert "waiting for the first profiled window" in waiting and "starting" not in waiting


@given(
    fractions=st.lists(
        st.floats(0.0, 1.0), min_size=len(BUCKET_STYLES), max_size=len(BUCKET_STYLES)
    ),
    width=st.integers(1, 120),
)
def test_decomposition_bar_fills_its_width_in_proportion(
    fractions: list[float], width: int
) -> None:
    components = {key: f for (key, _, _), f in zip(BUCKET_STYLES, fractions, strict=True)}
    bar = decomposition_bar(components, width)
    assert len(bar.plain) == width
    total = sum(fractions)
    if total > 0:
        cells = dict.fromkeys((style for _, _, style in BUCKET_STYLES), 0)
        for span in bar.spans:
            cells[str(span.style)] += span.end - span.start
        assert sum(cells.values()) == width
        # Largest-remainder rounding: every bucket is within one cell of its exact share.
        for (_, _, style), fraction in zip(BUCKET_STYLES, fractions, strict=True):
            assert abs(cells[style] - fraction / total * width) < 1.0


def _fake_proc(root: Path, parents: dict[int, int]) -> Path:
    for pid, parent in parents.items():
        (root / str(pid)).mkdir(parents=True)
        # comm may contain spaces and parentheses: the parser must cope.
        (root / str(pid) / "stat").write_text(f"{pid} (python (x) y) S {parent} {pid} 0 0\n")
    (root / "self").mkdir()
    return root


def test_process_tree_walks_descendants_parents_first(tmp_path: Path) -> None:
    proc = _fake_proc(tmp_path, {10: 1, 11: 10, 12: 10, 13: 11, 20: 1, 21: 20})
    assert process_tree(10, proc) == [10, 11, 12, 13]
    assert process_tree(21, proc) == [21]


PROJECT_CONFIG = {
    "global": {"scrape_interval": "15s", "evaluation_interval": "15s"},
    "rule_files": ["rules/a.yml", "rules/b.yml"],
    "scrape_configs": [
        {"job_name": "mfuscope-collector", "honor_labels": True,
         "static_configs": [{"targets": ["127.0.0.1:9464"]}]},
        {"job_name": "kubernetes-pods", "kubernetes_sd_configs": [{"role": "pod"}]},
    ],
}  # fmt: skip


def test_prometheus_config_points_the_project_config_at_the_demo() -> None:
    config = prometheus_config(PROJECT_CONFIG, Path("/repo/deploy/prometheus"), "127.0.0.1:4321")
    assert config["rule_files"] == [
        "/repo/deploy/prometheus/rules/a.yml",
        "/repo/deploy/prometheus/rules/b.yml",
    ]
    (job,) = config["scrape_configs"]
    assert job["honor_labels"] is True
    assert job["static_configs"] == [{"targets": ["127.0.0.1:4321"]}]
    assert config["global"]["scrape_interval"] == "5s"
    assert PROJECT_CONFIG["global"]["scrape_interval"] == "15s"  # the input is not mutated
    with pytest.raises(ServiceError, match="no static mfuscope scrape job"):
        prometheus_config({"scrape_configs": []}, Path("/x"), "h:1")


def test_demo_finds_the_projects_prometheus_config_in_a_source_checkout() -> None:
    # `--prometheus` runs the shipped config and rules; the lookup is relative to the package's
    # own files, so it breaks silently when a module moves ("needs a source checkout").
    config_dir = project_prometheus_dir()
    root = Path(__file__).resolve().parents[3]
    assert config_dir == root / "deploy" / "prometheus"
    assert (config_dir / "prometheus.yml").is_file()


def test_a_rank_is_named_a_straggler_only_past_the_threshold() -> None:
    assert straggler_text(SUMMARY) == (
        "none above ×1.20 (slowest rank 1 ×1.04, own time, last 20 steps)"
    )
    slow = {**SUMMARY, "stragglers": [{"rank": 3, "ratio": 1.31}, {"rank": 1, "ratio": 1.02}]}
    assert straggler_text(slow) == "rank 3 ×1.31 (own time, last 20 steps)"


def _report(step: int, breakdown: int | None) -> StepReport:
    parts = () if breakdown is None else (ComponentShare("compute", 0.1),)
    return StepReport(step, step * 100_000_000, 0.1, 1e9, 0.0, parts, breakdown_step=breakdown)


def _line(rank: int, reports: list[StepReport]) -> str:
    batch = ReportBatch(
        job="demo",
        rank=rank,
        world_size=2,
        host="h",
        device="cpu",
        peak_flops=1e10,
        peak_source="measured",
        sent_unix_ns=1,
        reports=tuple(reports),
    )
    return encode_batch(batch).decode() + "\n"


def test_the_agent_tail_tells_measured_from_carried_as_lines_arrive(tmp_path: Path) -> None:
    tail = AgentTail(tmp_path)
    assert tail.poll() is None and breakdown_line(None) == "no profiled window measured yet"
    first = _line(0, [_report(n, None) for n in range(3)] + [_report(3, 3), _report(4, 4)])
    later = _line(0, [_report(n, 4) for n in range(5, 9)])
    path = tmp_path / "rank0.jsonl"
    path.write_text(first + later[:40])  # the second line is still being written
    status = tail.poll()
    assert status is not None and status.coverage.measured == 2
    assert status.coverage.carried == 0 and status.window_age_steps == 0
    with path.open("a") as stream:
        stream.write(later[40:])
    status = tail.poll()
    assert status is not None
    assert (status.coverage.windows, status.coverage.measured, status.coverage.carried) == (1, 2, 4)
    assert (status.latest_window_step, status.window_age_steps) == (4, 4)
    assert status.window_age_s == pytest.approx(0.4)
    assert breakdown_line(status) == (
        "latest window at step 4 (4 steps / 0.4 s ago); 1 window measured 2 rank-steps, "
        "4 carry a window's breakdown"
    )


def test_a_stopping_signal_whose_exception_was_dropped_still_stops_the_demo() -> None:
    # Python drops an exception raised while the main thread runs a finalizer; the demo's wait
    # loops call check() each turn, so the signal still ends them.
    import signal

    from mfuscope.cli.demo import _interrupt

    before = signal.getsignal(signal.SIGTERM)
    restore = _interrupt.install()
    try:
        _interrupt.check()  # nothing received: no exception
        handler = signal.getsignal(signal.SIGTERM)
        assert callable(handler)
        with contextlib.suppress(KeyboardInterrupt):  # raised, then dropped by its catcher
            handler(signal.SIGTERM, None)
        with pytest.raises(KeyboardInterrupt, match="SIGTERM"):
            _interrupt.check()
    finally:
        restore()
    _interrupt.check()  # restored and forgotten
    assert signal.getsignal(signal.SIGTERM) is before
