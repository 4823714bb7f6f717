"""The C pre-filter under AddressSanitizer and UBSan: its own tests and a fuzz corpus
(`fuzz_select.py`) run in a child process against a sanitized build; any sanitizer report
fails the test. A canary extension with a known overflow proves the set-up reports one."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.support.sanitized_select import REPORT_MARKERS, SOURCE, build, sanitized_env
from tests.support.shared_data import real_trace_params

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[3]
# Under its own tests and the fuzz corpus; about 45 s here (2 shared cores).
SUITE = [HERE / "test_select.py", HERE / "test_columns.py", HERE / "fuzz_select.py"]
# Left out of the sanitized run: tests whose scanner inputs others in it scan as they are, in
# both scan modes (test_columns.py's real traces test scans the same real traces whole), so
# that under the sanitizers they would only repeat an analysis: pure Python, the slowest part
# of the run. The plain suite runs them.
REPEATED = [
    "tests/unit/core/trace/test_select.py::" + name
    for name in (
        "test_real_traces_lose_only_unread_events_and_analyse_the_same",
        "test_without_the_compiled_scanner_read_trace_gives_the_same_analysis",
    )
]  # each over the real traces, in both scan modes
TIMEOUT_S = 300


def _built(
    out_dir: Path, source: Path | None = None, sanitizers: str = "address,undefined"
) -> tuple[Path, list[str]]:
    built = build(out_dir, SOURCE if source is None else source, sanitizers)
    if isinstance(built, str):
        pytest.skip(built)  # no compiler or no sanitizer runtime: nothing to run under
    return built


def _reports(output: str) -> list[str]:
    return [line for line in output.splitlines() if any(m in line for m in REPORT_MARKERS)]


_CANARY = textwrap.dedent(
    """
    #define PY_SSIZE_T_CLEAN
    #include <Python.h>
    #include <limits.h>
    #include <stdlib.h>
    static PyObject *after_free(PyObject *m, PyObject *arg) {
        char *p = malloc(8);
        p[0] = 1;
        if (PyObject_IsTrue(arg))
            free(p);
        char c = p[0];
        if (!PyObject_IsTrue(arg))
            free(p);
        return PyLong_FromLong(c);
    }
    static PyObject *add(PyObject *m, PyObject *arg) {
        int n = (int)PyLong_AsLong(arg);
        return PyLong_FromLong(INT_MAX - 1 + n); /* n == 2: signed overflow */
    }
    static PyMethodDef methods[] = {
        {"after_free", after_free, METH_O, ""}, {"add", add, METH_O, ""}, {NULL, NULL, 0, NULL}};
    static struct PyModuleDef def = {PyModuleDef_HEAD_INIT, "canary", "", -1, methods};
    PyMODINIT_FUNC PyInit_canary(void) { return PyModule_Create(&def); }
    """
)


@pytest.mark.slow  # a compiler and a sanitized child process
@pytest.mark.parametrize(
    ("call", "report"),
    [("after_free", "heap-use-after-free"), ("add", "signed integer overflow")],
)
def test_a_sanitizer_report_fails_the_child(tmp_path: Path, call: str, report: str) -> None:
    source = tmp_path / "canary.c"
    source.write_text(_CANARY)
    module, runtimes = _built(tmp_path, source)
    code = (
        "import importlib.util as u\n"
        f"s = u.spec_from_file_location('canary', {str(module)!r})\n"
        "m = u.module_from_spec(s); s.loader.exec_module(m)\n"
        f"m.{call}(False if {call!r} == 'after_free' else 1)\n"
        "print('harmless call ok', flush=True)\n"
        f"m.{call}(True if {call!r} == 'after_free' else 2)\n"
        "print('not reached', flush=True)\n"
    )
    child = subprocess.run(
        [sys.executable, "-c", code],
        env=sanitized_env(runtimes),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert "harmless call ok" in child.stdout and "not reached" not in child.stdout
    assert child.returncode != 0
    assert any(report in line for line in _reports(child.stderr)), child.stderr


@pytest.mark.slow  # a compiler and a sanitized child process
def test_the_scanner_under_sanitizers(tmp_path: Path) -> None:
    module, runtimes = _built(tmp_path)
    command = [sys.executable, "-m", "pytest", "-q", "-p", "tests.support.sanitized_select"]
    command += ["-p", "no:cacheprovider", *map(str, SUITE)]
    command += [f"--deselect={test}" for test in REPEATED]
    child = subprocess.run(
        command,
        cwd=ROOT,
        env=sanitized_env(runtimes, module),
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        check=False,
    )
    output = child.stdout + child.stderr
    assert not _reports(output), output[-20_000:]
    assert child.returncode == 0, output[-20_000:]
    assert " passed" in output, output[-2000:]
    assert f" {len(REPEATED) * len(real_trace_params()) * 2} deselected" in output, output[-2000:]


_CONCURRENT = textwrap.dedent(
    """
    import threading
    import tests.support.sanitized_select  # puts the sanitized build in place
    from mfuscope.core.trace import _select
    scanner = tests.support.sanitized_select.installed()
    scanner.set_split_min_bytes(0)  # every array in two halves, on two threads
    event = (
        b'{"ph": "X", "cat": "kernel", "name": "k%d", "pid": 0, "tid": 7, "ts": %d.5, '
        b'"dur": 2, "args": {"correlation": %d}}, {"ph": "s", "cat": "ac2g", "id": %d}'
    )
    raw = b'{"traceEvents": [' + b", ".join(event % (i % 50, i, i, i) for i in range(3000)) + b"]}"
    def scan():
        for _ in range(4):
            assert _select.select_events(raw).columns is not None
    threads = [threading.Thread(target=scan) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    print("split", scanner.split_counts())
    """
)


@pytest.mark.slow  # a compiler and a sanitized child process
def test_concurrent_scans_under_thread_sanitizer(tmp_path: Path) -> None:
    """Analyser threads may scan at once, each scan on two threads: no data race."""
    module, runtimes = _built(tmp_path, sanitizers="thread")
    child = subprocess.run(
        [sys.executable, "-c", _CONCURRENT],
        cwd=ROOT,
        env=sanitized_env(runtimes, module),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert not _reports(child.stderr), child.stderr[-20_000:]
    assert child.returncode == 0, child.stderr[-5000:]
    assert "split (16, 0)" in child.stdout  # 16 scans, each joined from two halves
