"""Every flag of every subcommand explains itself, and `mfuscope --version` answers."""

from __future__ import annotations

import argparse
import subprocess
import sys

import pytest
from mfuscope.cli import SUBCOMMANDS, build_parser


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    (sub,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(sub.choices)


def test_every_flag_of_every_subcommand_has_help() -> None:
    parsers = _subparsers(build_parser())
    assert sorted(parsers) == sorted(SUBCOMMANDS)
    lacking = [
        f"mfuscope {name} {'/'.join(action.option_strings) or action.dest}"
        for name, parser in parsers.items()
        for action in parser._actions
        if not isinstance(action, argparse._HelpAction)
        and (not action.help or action.help == argparse.SUPPRESS)
    ]
    assert lacking == []


@pytest.mark.parametrize("name", sorted(SUBCOMMANDS))
def test_every_subcommand_prints_its_help(name: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        build_parser(name).parse_args([name, "--help"])
    assert done.value.code == 0
    assert "usage: mfuscope " + name in capsys.readouterr().out


@pytest.mark.slow  # the installed mfuscope command
def test_version() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "mfuscope.cli", "--version"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0
    assert done.stdout.startswith("mfuscope ") and done.stdout.split()[1][0].isdigit()
