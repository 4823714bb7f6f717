"""Write deploy/prometheus/rules/mfuscope-recording.yml from mfuscope.core.promql.

    python deploy/prometheus/build_rules.py          # rewrite the recording rules
    python deploy/prometheus/build_rules.py --check  # exit 1 if the shipped file is stale

The rules are built from the one PromQL definition of each quantity (core/promql/), which the
dashboard generator uses too; never edit the YAML by hand. The alerts (mfuscope-alerts.yml) are
written by hand and read only recorded series.
"""

from __future__ import annotations

import argparse
import difflib
import sys
from collections.abc import Sequence
from pathlib import Path

from mfuscope.core.promql import recording

RECORDING_RULES = Path(__file__).resolve().parent / "rules" / "mfuscope-recording.yml"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="compare instead of writing")
    parser.add_argument("--output", type=Path, default=RECORDING_RULES)
    args = parser.parse_args(argv)
    text = recording.text()
    current = args.output.read_text(encoding="utf-8") if args.output.exists() else ""
    if current == text:
        return 0
    if args.check:
        diff = difflib.unified_diff(
            current.splitlines(), text.splitlines(), str(args.output), "generated", lineterm=""
        )
        print("\n".join(list(diff)[:40]), file=sys.stderr)
        print(f"stale: {args.output.name}; run {Path(__file__).name}", file=sys.stderr)
        return 1
    args.output.write_text(text, encoding="utf-8")
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
