"""Generate the mfuscope Grafana dashboards (Grafana 11.6) from code.

    python dashboards/generator/build.py          # rewrite dashboards/*.json
    python dashboards/generator/build.py --check  # exit 1 if a checked-in file is stale

Built with grafana-foundation-sdk (pinned to its Grafana 11.6 build in pyproject.toml). The JSON
files next to this folder are what users import or provision; never edit them by hand.
"""

from __future__ import annotations

import argparse
import difflib
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import communication_dashboard
import fleet_dashboard
import job_dashboard
from _common import to_json

__all__ = ["DASHBOARDS", "main", "render_all"]

OUTPUT_DIR = Path(__file__).resolve().parent.parent

# file name -> builder
DASHBOARDS: dict[str, Callable[[], Any]] = {
    "mfuscope-fleet.json": fleet_dashboard.build,
    "mfuscope-job.json": job_dashboard.build,
    "mfuscope-communication.json": communication_dashboard.build,
}


def render_all() -> dict[str, str]:
    """File name -> dashboard JSON text."""
    return {name: to_json(build()) for name, build in DASHBOARDS.items()}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="compare instead of writing")
    parser.add_argument("--output-dir", type=Path, default=OUTPUT_DIR)
    args = parser.parse_args(argv)
    stale = []
    for name, text in render_all().items():
        path = args.output_dir / name
        current = path.read_text(encoding="utf-8") if path.exists() else ""
        if current == text:
            continue
        if args.check:
            stale.append(name)
            diff = difflib.unified_diff(
                current.splitlines(), text.splitlines(), str(path), "generated", lineterm=""
            )
            print("\n".join(list(diff)[:40]), file=sys.stderr)
        else:
            path.write_text(text, encoding="utf-8")
            print(f"wrote {path}")
    if stale:
        print(f"stale: {', '.join(stale)}; run {Path(__file__).name}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
