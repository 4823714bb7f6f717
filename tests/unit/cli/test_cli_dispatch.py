"""The `mfuscope` dispatcher: the top-level help lists every subcommand without importing any of
them (that is what keeps `mfuscope --help` near a bare Python start; the timing itself is
`benchmarks/cli_startup.py`)."""

from __future__ import annotations

import subprocess
import sys

from mfuscope.cli import SUBCOMMANDS

SCRIPT = """
import contextlib, io, sys
from mfuscope.cli import main
out = io.StringIO()
with contextlib.redirect_stdout(out):
    try:
        main(["--help"])
    except SystemExit as exit:
        code = exit.code
loaded = sorted(m for m in sys.modules if m.startswith("mfuscope.") and m != "mfuscope.cli")
heavy = sorted(m for m in ("numpy", "torch", "msgspec", "aiohttp") if m in sys.modules)
print(code, ",".join(loaded) or "-", ",".join(heavy) or "-")
print(out.getvalue())
"""


def test_top_level_help_lists_every_subcommand_and_imports_none() -> None:
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=60, check=True
    )
    first, _, help_text = done.stdout.partition("\n")
    code, loaded, heavy = first.split()
    assert code == "0"
    assert loaded == "-", f"the top-level help imported {loaded}"
    assert heavy == "-", f"the top-level help imported {heavy}"
    for name, (_, help_line) in SUBCOMMANDS.items():
        assert name in help_text
        assert help_line.split()[0] in help_text
