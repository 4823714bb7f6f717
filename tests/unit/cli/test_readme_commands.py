"""The README's shell commands run as written after `./dev demo` / `./dev test`: the CLI is
`./dev mfuscope ...` from the checkout (never a bare `mfuscope`, which is not on PATH there), and
each such command names a real subcommand with options its parser accepts."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
from mfuscope.cli import build_parser

ROOT = Path(__file__).resolve().parents[3]


def _shell_commands() -> list[str]:
    """Every command line of the README's ``sh`` blocks, continuations joined, comments cut."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    commands = []
    for block in re.findall(r"```sh\n(.*?)```", text, re.DOTALL):
        for line in block.replace("\\\n", " ").splitlines():
            words = shlex.split(line, comments=True)
            if words:
                commands.append(shlex.join(words))
    return commands


COMMANDS = _shell_commands()
CLI = [c for c in COMMANDS if c.startswith("./dev mfuscope")]


def test_no_bare_mfuscope_command() -> None:
    assert CLI, "the README shows no ./dev mfuscope command"
    assert [c for c in COMMANDS if c.split()[0] == "mfuscope"] == []


@pytest.mark.parametrize("command", CLI)
def test_each_cli_command_parses(command: str) -> None:
    argv = shlex.split(command)[2:]
    subcommand = next((a for a in argv if not a.startswith("-")), None)
    parser = build_parser(subcommand)
    try:
        parser.parse_args(argv)
    except SystemExit as exc:  # --version and --help exit 0 after printing; errors exit 2
        assert exc.code == 0, command
