"""The `mfuscope` command: a thin dispatcher over one module per subcommand.

Subcommand modules are imported lazily so that `mfuscope collector` and `mfuscope analyze` never
import torch (the collector runs in a slim container without it).
"""

from __future__ import annotations

import argparse
import atexit
import gc
import importlib
import os
import sys
from collections.abc import Sequence
from types import ModuleType

__all__ = ["SubcommandUnavailable", "build_parser", "console_main", "main"]

DESCRIPTION = "Live MFU and communication exposure of distributed PyTorch training."

# name -> (module under mfuscope.cli, one-line help). Each module defines
# `add_arguments(parser)` and `run(args) -> int` (the exit code).
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "analyze": ("analyze", "decompose profiled steps of Kineto traces (MFU, buckets, collectives)"),
    "calc": ("calc", "back-of-envelope FLOPs, MFU and communication what-if calculator"),
    "compare": ("compare", "compare two runs side by side (traces, agent output, summaries)"),
    "collector": ("run_collector", "run the collector: ingest agent reports, serve /metrics"),
    "demo": ("demo", "run a live 2-rank gloo training job feeding a collector"),
    "report": ("report", "write a self-contained HTML report from agent output or traces"),
    "validate-gpu": ("validate_gpu", "measure on a CUDA GPU and write validate.json/.md"),
}

# Subcommands whose numpy work is element-wise (sorts, searches, prefix sums) and never calls
# BLAS: numpy's OpenBLAS would start a thread per core at import for nothing (~25-30 ms of
# CPU at `mfuscope analyze`'s start-up, much more wall time on a busy machine).
_WITHOUT_BLAS = frozenset({"analyze"})
# Subcommands whose process may end without the interpreter's teardown (`console_main`).
_WITHOUT_TEARDOWN = frozenset({"analyze"})


def _skip_blas_threads(command: str) -> None:
    """Ask OpenBLAS (the BLAS of numpy's wheels) for one thread, before numpy is imported,
    unless the user chose a number."""
    if command in _WITHOUT_BLAS and "numpy" not in sys.modules:
        os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")


class _WidthlessFormatter(argparse.HelpFormatter):
    """The formatter while the parser is built. argparse makes one at every `add_argument` (to
    check the metavar) and at `add_subparsers` (for the prog), and its default asks `shutil`
    for the terminal width, which none of those use: importing shutil (with bz2 and lzma) is
    ~3.5 ms of `mfuscope analyze`'s start-up. Help and errors get argparse's own formatter
    back (`build_parser`), with the terminal's width."""

    def __init__(self, prog: str) -> None:
        super().__init__(prog, width=80)


# Third-party modules a subcommand may import, and the extra that installs each.
_EXTRA_OF_MODULE = {
    "torch": "agent",
    "pynvml": "agent",
    "matplotlib": "report",
    "rich": "report",
    "yaml": "report",
}


class _VersionAction(argparse.Action):
    """``--version``: looks the installed version up only when asked (importlib.metadata is
    ~10 ms of imports that `mfuscope --help` does without)."""

    def __init__(self, option_strings: Sequence[str], dest: str, help: str) -> None:
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, help=help)

    def __call__(self, parser: argparse.ArgumentParser, *args: object) -> None:
        from importlib.metadata import PackageNotFoundError, version

        try:
            installed = version("mfuscope")
        except PackageNotFoundError:  # run from a source tree without installing it
            installed = "unknown (not installed)"
        print(f"mfuscope {installed}")
        parser.exit()


class SubcommandUnavailable(Exception):
    """A subcommand's module, or a module it needs, cannot be imported; the message is one line
    that names the module and what to install."""


def _subcommand_module(command: str, module: str) -> ModuleType:
    """``mfuscope.cli.<module>``. Importing it is also what finds it: `importlib.util.find_spec`
    would import importlib.util (~1.5 ms) for a module imported right after anyway."""
    name = f"mfuscope.cli.{module}"
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as exc:
        missing = exc.name or "?"
        if missing == name or missing.startswith("mfuscope."):
            raise SubcommandUnavailable(
                f"mfuscope {command}: this installation lacks the module {missing} "
                f"(a broken install: reinstall mfuscope)"
            ) from exc
        top = missing.split(".")[0]
        extra = _EXTRA_OF_MODULE.get(top)
        hint = f": pip install 'mfuscope[{extra}]'" if extra else ""
        raise SubcommandUnavailable(
            f"mfuscope {command}: needs the Python module {top!r}, which is not installed{hint}"
        ) from exc


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The whole parser; with `command`, only that subcommand gets its arguments (building all
    of them imports every subcommand module: numpy and the trace engine for `analyze`, ~0.2 s).
    `command=""` gives none of them their arguments: the top-level `--help` needs only the names
    and one-line helps, so `mfuscope --help` costs little more than starting Python. Raises
    `SubcommandUnavailable` when a chosen subcommand cannot be imported."""
    parser = argparse.ArgumentParser(
        prog="mfuscope", description=DESCRIPTION, formatter_class=_WidthlessFormatter
    )
    parser.add_argument("--version", action=_VersionAction, help="print the version and exit")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    built = [parser]
    for name, (module, help_text) in SUBCOMMANDS.items():
        chosen = command is None or name == command
        command_module = _subcommand_module(name, module) if chosen else None
        sub_parser = sub.add_parser(
            name, help=help_text, description=help_text, formatter_class=_WidthlessFormatter
        )
        built.append(sub_parser)
        if command_module is not None:
            command_module.add_arguments(sub_parser)
    for built_parser in built:
        built_parser.formatter_class = argparse.HelpFormatter
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    words = list(sys.argv[1:] if argv is None else argv)
    command = words[0] if words and words[0] in SUBCOMMANDS else ""
    _skip_blas_threads(command)
    # Building the parser imports the subcommand's modules: tens of thousands of new objects and
    # no garbage, yet enough allocations for ~50 young-generation collections, so the cyclic GC
    # waits until they are loaded. What it buys (`benchmarks/analyze_bench.py --tricks`, whole
    # `mfuscope analyze` process, two runs): 5.0-5.4% on a 2M-event trace, nothing measurable
    # (0.99-1.01x) on 40-57k-event real ones.
    collecting = gc.isenabled()
    gc.disable()
    try:
        parser = build_parser(command)
        args = parser.parse_args(words)
    except SubcommandUnavailable as exc:
        print(exc, file=sys.stderr)
        return 2
    finally:
        if collecting:
            gc.enable()
    if args.command is None:
        parser.print_help(sys.stderr)
        return 2
    module = importlib.import_module(f"mfuscope.cli.{SUBCOMMANDS[args.command][0]}")
    try:
        return int(module.run(args))
    except KeyboardInterrupt:
        print("mfuscope: interrupted", file=sys.stderr)
        return 130


def console_main() -> None:
    """The `mfuscope` console script and ``python -m mfuscope.cli``: `main`, then exit (never
    returns; not annotated NoReturn, which would import `typing` at `mfuscope --help`)."""
    words = sys.argv[1:]
    code = main(words)
    if words and words[0] in _WITHOUT_TEARDOWN:
        _exit_without_teardown(code)
    sys.exit(code)


def _exit_without_teardown(code: int) -> None:
    """End the process at once once stdout and stderr are flushed; return if that is not safe.

    The interpreter's teardown frees every object of the analysis and every module one by one,
    for nothing (what that costs a whole `mfuscope analyze` process, `benchmarks/analyze_bench.py
    --tricks`: benchmarks/RESULTS.md#whole-process-and-start-up). Skipping
    it is safe because `analyze` has written all its output (flushed here), closed every file it
    read (`trace_io` reads each whole with a `with`), and leaves no thread running (its import
    thread is joined). Not when anything is registered to run at exit (a coverage tool, a
    user's sitecustomize): then the normal exit runs it. A failed flush (a closed pipe) returns
    too, so that the normal exit reports it as it always did."""
    if atexit._ncallbacks():
        return
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except (OSError, ValueError, AttributeError):  # AttributeError: no sys.stdout at all
        return
    os._exit(code)
