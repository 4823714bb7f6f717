"""The layers import only downwards: cli -> {agent, collector} -> {core, exporters}.

Read from the source files (every import statement, also those inside functions or under
TYPE_CHECKING), so a rule breaks here even when no test happens to import the offending module.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# layer -> (modules it may not import, as prefixes)
FORBIDDEN: dict[str, tuple[str, ...]] = {
    "core": (
        "torch",
        "subprocess",
        "mfuscope.agent",
        "mfuscope.collector",
        "mfuscope.exporters",
        "mfuscope.cli",
    ),
    "agent": ("mfuscope.collector", "mfuscope.exporters", "mfuscope.cli"),
    "collector": ("torch", "mfuscope.agent", "mfuscope.cli"),
    "exporters": ("torch", "mfuscope.agent", "mfuscope.collector", "mfuscope.cli"),
}


def _imports(path: Path, root: Path) -> list[tuple[int, str]]:
    """(line, absolute module name) of every import in `path` (a file of the checkout at `root`,
    whose top-level folders are the `mfuscope.*` packages); relative imports resolved."""
    package = ".".join(("mfuscope", *path.relative_to(root).parent.parts))
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                module = f"{base}.{node.module}" if node.module else base
            else:
                module = node.module or ""
            found.append((node.lineno, module))
            # `from mfuscope import agent` imports the package mfuscope.agent.
            found += [(node.lineno, f"{module}.{alias.name}") for alias in node.names]
    return found


def _violations(layer: str, root: Path = ROOT) -> list[str]:
    bad = []
    for path in sorted((root / layer).rglob("*.py")):
        for line, module in _imports(path, root):
            for prefix in FORBIDDEN[layer]:
                if module == prefix or module.startswith(prefix + "."):
                    bad.append(f"{path.relative_to(root)}:{line} imports {module}")
    return bad


@pytest.mark.parametrize("layer", sorted(FORBIDDEN))
def test_layer_imports_point_down(layer: str) -> None:
    assert not _violations(layer)


def test_exporters_import_only_core() -> None:
    outside = [
        f"{path.relative_to(ROOT)}:{line} imports {module}"
        for path in sorted((ROOT / "exporters").rglob("*.py"))
        for line, module in _imports(path, ROOT)
        if module.startswith("mfuscope")
        and not module.startswith(("mfuscope.core", "mfuscope.exporters"))
    ]
    assert not outside


def test_the_rules_see_a_violation(tmp_path: Path) -> None:
    """The walker is not blind: each kind of import statement is reported."""
    (tmp_path / "core" / "trace").mkdir(parents=True)
    (tmp_path / "core" / "trace" / "probe.py").write_text(
        "import torch\nfrom mfuscope.collector import ingest\nfrom ...agent import _agent\n"
        "def f():\n    import subprocess\n",
        encoding="utf-8",
    )
    found = _violations("core", tmp_path)
    assert [v.split(" imports ")[1] for v in found] == [
        "torch",
        "mfuscope.collector",
        "mfuscope.collector.ingest",
        "mfuscope.agent",
        "mfuscope.agent._agent",
        "subprocess",
    ]


def test_importing_the_agent_loads_no_collector_module() -> None:
    code = (
        "import sys; from mfuscope.agent import Agent; "
        "print([m for m in sys.modules if m.startswith('mfuscope.collector')])"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    assert result.stdout.strip() == "[]"
