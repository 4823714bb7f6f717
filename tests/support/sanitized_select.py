"""The C trace pre-filter (`core/trace/_select.c`) built with AddressSanitizer and
UndefinedBehaviorSanitizer (or ThreadSanitizer), and a pytest plugin that runs tests against that
build.

The scanner runs in every rank's analyser thread, so a memory error in it ends a training job.
`build` compiles it with ``-fsanitize=address,undefined`` (every undefined-behaviour report
fatal) into a folder of the caller's; `sanitized_env` is the environment a Python process needs
to load it: the compiler's ASan and UBSan runtimes preloaded (the interpreter itself is not
instrumented) and leak detection off (the interpreter keeps objects alive at exit by design).
Python keeps its pymalloc arenas (``PYTHONMALLOC=malloc`` made the run about twice as long):
the scanner's own buffers and every bytes object over 512 bytes come from ASan's malloc, with
red zones around them; a smaller input sits in an arena, where a read past its end finds
another object and no report, so the fuzz corpus also scans small inputs padded past 512
bytes with leading whitespace (`fuzz_select.scanned`).

Loaded with ``-p tests.support.sanitized_select``, this module puts the sanitized build in
`sys.modules` under the production name before anything imports `mfuscope.core.trace._select`,
so every test in that run exercises it.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path
from types import ModuleType

__all__ = [
    "MODULE",
    "PATH_ENV",
    "REPORT_MARKERS",
    "SOURCE",
    "build",
    "installed",
    "sanitized_env",
    "sanitizer_runtimes",
]

ROOT = Path(__file__).resolve().parents[2]
SOURCE = ROOT / "core" / "trace" / "_select.c"
MODULE = "mfuscope.core.trace._select_c"
PATH_ENV = "MFUSCOPE_SANITIZED_SELECT"
# What a sanitizer writes when it finds something (ASan's header; UBSan's per-report line).
REPORT_MARKERS = (
    "ERROR: AddressSanitizer",
    "runtime error:",
    "ERROR: LeakSanitizer",
    "WARNING: ThreadSanitizer",
)

_FLAGS = [
    "-shared",
    "-fPIC",
    "-O1",  # some optimisation, so the code is close to the -O2 build, still exact reports
    "-g",
    "-fno-omit-frame-pointer",
    "-fno-sanitize-recover=all",  # any UB report aborts the process: the test fails
    "-pthread",  # big arrays are scanned in two halves on two threads
]
# sanitizer -> its shared runtime
_RUNTIMES = {"address": "libasan.so", "undefined": "libubsan.so", "thread": "libtsan.so"}


def _compiler() -> str | None:
    configured = (sysconfig.get_config_var("CC") or "").split()
    for candidate in (*configured[:1], "gcc", "cc", "clang"):
        if shutil.which(candidate):
            return candidate
    return None


def sanitizer_runtimes(compiler: str, sanitizers: str) -> list[str] | None:
    """The shared runtimes of `compiler` for `sanitizers` (``address,undefined``), or None when
    it lacks one."""
    found = []
    for name in (_RUNTIMES[s] for s in sanitizers.split(",")):
        result = subprocess.run(
            [compiler, f"-print-file-name={name}"], capture_output=True, text=True, check=False
        )
        path = result.stdout.strip()
        if result.returncode != 0 or not os.path.isabs(path) or not os.path.exists(path):
            return None  # clang prints the bare name when it has no such file
        found.append(path)
    return found


def build(
    out_dir: Path, source: Path = SOURCE, sanitizers: str = "address,undefined"
) -> tuple[Path, list[str]] | str:
    """Compile `source` as the extension `_select_c` (or a module named after the source's
    stem) with `sanitizers`; the built file and the runtimes to preload, or why not."""
    compiler = _compiler()
    if compiler is None:
        return "no C compiler on PATH"
    runtimes = sanitizer_runtimes(compiler, sanitizers)
    if runtimes is None:
        return f"{compiler} has no shared runtime for -fsanitize={sanitizers}"
    stem = "_select_c" if source == SOURCE else source.stem
    target = out_dir / (stem + (sysconfig.get_config_var("EXT_SUFFIX") or ".so"))
    include = sysconfig.get_paths()["include"]
    flags = [*_FLAGS, f"-fsanitize={sanitizers}"]
    command = [compiler, *flags, f"-I{include}", str(source), "-o", str(target)]
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        return f"sanitized build failed: {' '.join(command)}\n{result.stderr}"
    return target, runtimes


def sanitized_env(runtimes: list[str], module_path: Path | None = None) -> dict[str, str]:
    """The environment of a Python process that loads a sanitized extension."""
    env = dict(os.environ)
    env["LD_PRELOAD"] = " ".join(runtimes)
    env["ASAN_OPTIONS"] = "detect_leaks=0:halt_on_error=1:abort_on_error=0:exitcode=86"
    env["UBSAN_OPTIONS"] = "halt_on_error=1:print_stacktrace=1:exitcode=87"
    env["TSAN_OPTIONS"] = "halt_on_error=1:report_signal_unsafe=0:exitcode=88"
    env["PYTHONFAULTHANDLER"] = "1"
    if module_path is not None:
        env[PATH_ENV] = str(module_path)
    return env


def _install() -> None:
    path = os.environ.get(PATH_ENV)
    if not path:
        raise RuntimeError(f"-p {__name__} needs {PATH_ENV} (the sanitized build's path)")
    if "mfuscope.core.trace._select" in sys.modules:
        raise RuntimeError("the production scanner was imported before the sanitized one")
    loader = importlib.machinery.ExtensionFileLoader(MODULE, path)
    spec = importlib.util.spec_from_file_location(MODULE, path, loader=loader)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    sys.modules[MODULE] = module


def installed() -> ModuleType:
    """The sanitized build this process runs (after `_install`)."""
    return sys.modules[MODULE]


if os.environ.get(PATH_ENV) and __name__ != "__main__":
    _install()
