"""`mfuscope compare --html DIR`: one self-contained page, the deltas and both runs' plots.

The plots are the report's (`cli.report.writer.plot_svgs`), drawn for each side and set side by
side; a collector summary has no steps to plot and says so. Inline CSS and SVG, no scripts,
nothing fetched from a network; written to a temporary name and renamed.
"""

from __future__ import annotations

import html
import os
from collections.abc import Sequence
from pathlib import Path

from mfuscope.cli.compare._render import measured_line, render_text
from mfuscope.cli.report.writer import PLOT_NAMES, ReportContent, plot_svgs
from mfuscope.core.run_summary.comparison import Comparison

__all__ = ["HTML_NAME", "write_html"]

HTML_NAME = "compare.html"

_CSS = """
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;color:#222;
 max-width:1400px;margin:2em auto;padding:0 1em}
h2{margin-top:2em;border-bottom:1px solid #ddd}pre{background:#f6f6f6;padding:1em;overflow-x:auto}
.pair{display:flex;gap:1em}.pair figure{flex:1;margin:0;min-width:0}
figure svg{max-width:100%;height:auto}.missing{color:#a33}.meta{color:#666}
"""


def _figure(side: str, svgs: dict[str, str], missing: dict[str, str], plot: str) -> str:
    body = svgs.get(plot)
    if body is None:
        body = f'<p class="missing">not drawn: {html.escape(missing.get(plot, "no data"))}</p>'
    return f"<figure><figcaption>{side}</figcaption>{body}</figure>"


def render_page(
    comparison: Comparison, paths: Sequence[str], contents: Sequence[ReportContent | None]
) -> str:
    """The page: what each side measured, the text comparison, then each report plot of both."""
    drawn: list[tuple[dict[str, str], dict[str, str]]] = []
    for index, content in enumerate(contents):
        if content is None:
            reason = "a collector summary has no steps to plot"
            drawn.append(({}, dict.fromkeys(PLOT_NAMES, reason)))
        else:
            drawn.append(plot_svgs(content, salt=f"side{index}"))
    parts = [
        "<!doctype html><html><head><meta charset='utf-8'>",
        f"<title>mfuscope compare</title><style>{_CSS}</style></head><body>",
        "<h1>mfuscope compare</h1>",
    ]
    for name, path, profile in zip(
        ("baseline", "candidate"),
        paths,
        (comparison.baseline, comparison.candidate),
        strict=True,
    ):
        parts.append(
            f"<p><b>{name}</b>: {html.escape(path)}<br>"
            f'<span class="meta">{html.escape(measured_line(profile))}</span></p>'
        )
    parts += [f"<p class='missing'>warning: {html.escape(w)}</p>" for w in comparison.warnings]
    parts.append(f"<pre>{html.escape(render_text(comparison, paths, None, False))}</pre>")
    for plot in PLOT_NAMES:
        parts.append(f"<h2 id='plot-{plot}'>{html.escape(plot.replace('_', ' '))}</h2>")
        parts.append(
            "<div class='pair'>"
            + "".join(
                _figure(side, svgs, missing, plot)
                for side, (svgs, missing) in zip(("baseline", "candidate"), drawn, strict=True)
            )
            + "</div>"
        )
    parts.append("</body></html>\n")
    return "\n".join(parts)


def write_html(
    comparison: Comparison,
    paths: Sequence[str],
    contents: Sequence[ReportContent | None],
    out_dir: Path,
) -> Path:
    """Write `out_dir/compare.html`; return its path."""
    page = render_page(comparison, paths, contents)
    out_dir.mkdir(parents=True, exist_ok=True)
    target = out_dir / HTML_NAME
    tmp = target.with_name(f".{HTML_NAME}.{os.getpid()}.tmp")
    try:
        tmp.write_text(page, encoding="utf-8")
        os.replace(tmp, target)
    finally:
        tmp.unlink(missing_ok=True)
    return target
