"""The report: load agent JSONL or traces, aggregate, plot, write one self-contained HTML file.

    loaded = load_run([Path("mfuscope-demo-out/agent")])
    files = write_report(loaded.run, Path("mfuscope-demo-out"))

`write_report` writes `report.html` (inline SVG plots, no scripts, nothing fetched from a network)
and one `<plot>.png` per plot into the output directory; each file is written to a temporary name
and renamed, so an interrupted run never leaves a half-written report.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from mfuscope.cli.report._content import PLOT_NAMES, ReportContent, build_content
from mfuscope.cli.report._load import Loaded, TraceOptions, load_run
from mfuscope.core.run_summary.run_data import RankRun, RunData, merge_batches

__all__ = [
    "PLOT_NAMES",
    "Loaded",
    "RankRun",
    "ReportContent",
    "ReportFiles",
    "RunData",
    "TraceOptions",
    "build_content",
    "load_run",
    "merge_batches",
    "plot_svgs",
    "write_report",
]

HTML_NAME = "report.html"


@dataclass(frozen=True)
class ReportFiles:
    html: Path
    pngs: tuple[Path, ...]
    missing: tuple[tuple[str, str], ...]  # (plot, why it could not be drawn)
    content: ReportContent  # what the page shows


def _write_atomic(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        tmp.write_bytes(data)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def write_report(run: RunData, out_dir: Path, generated: str, *, png: bool = True) -> ReportFiles:
    """Aggregate `run`, draw every plot that has data, write `report.html` (+ PNGs) in `out_dir`.

    `generated` is the timestamp text shown on the page (the caller owns the clock).
    """
    from mfuscope.cli.report._html import render_html

    content = build_content(run)
    out_dir.mkdir(parents=True, exist_ok=True)
    svgs: dict[str, str] = {}
    pngs: list[Path] = []
    missing: list[tuple[str, str]] = []
    for name, drawn in _drawn(content, png=png):
        if isinstance(drawn, str):
            missing.append((name, drawn))
            continue
        svg, png_bytes = drawn
        svgs[name] = svg
        if png:
            path = out_dir / f"{name}.png"
            _write_atomic(path, png_bytes)
            pngs.append(path)
    html_path = out_dir / HTML_NAME
    _write_atomic(html_path, render_html(content, svgs, generated).encode("utf-8"))
    return ReportFiles(html_path, tuple(pngs), tuple(missing), content)


def _drawn(
    content: ReportContent, salt: str = "", *, png: bool = False
) -> list[tuple[str, tuple[str, bytes] | str]]:
    """Per plot in page order: its (SVG, PNG: empty unless `png`), or why it could not be drawn.
    `salt` keeps the SVG ids of several reports' plots apart on one page."""
    from mfuscope.cli.report import _plots

    out: list[tuple[str, tuple[str, bytes] | str]] = []
    for name in PLOT_NAMES:
        reason = content.missing(name)
        figure = None if reason else _plots.draw(name, content)
        out.append(
            (name, reason or "no data")
            if figure is None
            else (name, _plots.render(figure, salt=salt + name, png=png))
        )
    return out


def plot_svgs(content: ReportContent, salt: str) -> tuple[dict[str, str], dict[str, str]]:
    """The report's plots of `content` as inline SVG (plot -> SVG), and plot -> why it is not
    drawn; for pages that show several runs (`mfuscope compare --html`)."""
    svgs: dict[str, str] = {}
    missing: dict[str, str] = {}
    for name, drawn in _drawn(content, salt):
        if isinstance(drawn, str):
            missing[name] = drawn
        else:
            svgs[name] = drawn[0]
    return svgs, missing
