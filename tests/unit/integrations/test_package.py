"""`import mfuscope.integrations` stays light; a missing framework gives an install hint."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest


def run(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)


@pytest.mark.slow  # a child Python process (a fresh import)
def test_importing_the_package_imports_no_framework_and_no_torch() -> None:
    code = (
        "import sys, mfuscope.integrations, mfuscope.integrations.torchtitan\n"
        "heavy = {'torch', 'transformers', 'lightning', 'torchtitan'} & set(sys.modules)\n"
        "print(sorted(heavy))"
    )
    result = run(code)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


@pytest.mark.slow  # a child Python process (a fresh import)
def test_a_missing_framework_names_the_extra() -> None:
    code = (
        "import sys\n"
        "sys.modules['transformers'] = None  # as if not installed\n"
        "import mfuscope.integrations.huggingface\n"
    )
    result = run(code)
    assert result.returncode != 0
    assert "pip install 'mfuscope[huggingface]'" in result.stderr


def test_integrations_import_only_the_agent_and_core() -> None:
    allowed = ("mfuscope.agent", "mfuscope.core", "mfuscope.integrations")
    folder = Path(__file__).resolve().parents[3] / "integrations"
    found = []
    for path in sorted(folder.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            if isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            found += [(path.name, n) for n in names if n.startswith("mfuscope")]
    assert found, "the scan sees the imports"
    assert [(f, n) for f, n in found if not n.startswith(allowed)] == []
