"""The layers import only downwards: cli -> {agent, collector} -> {core, exporters}, and
integrations -> {agent, core} (docs/architecture.md#layers: they run inside training ranks, so
never the collector); and no module imports another package's private (``_x``) modules or names.

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
    "integrations": ("mfuscope.collector", "mfuscope.exporters", "mfuscope.cli"),
}
LAYERS = ("core", "agent", "collector", "exporters", "cli", "integrations")


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


def _private_owner(module: str, root: Path) -> str | None:
    """The package a private part of `module` belongs to (None: nothing private in it).
    ``mfuscope.agent._health`` -> ``mfuscope.agent``; a private name of a module,
    ``mfuscope.agent.topology._env_int``, -> the module's package, ``mfuscope.agent``."""
    parts = module.split(".")
    if parts[0] != "mfuscope":
        return None
    for at, part in enumerate(parts[1:], start=1):
        if part.startswith("_") and not (part.startswith("__") and part.endswith("__")):
            owner = parts[:at]
            if len(owner) > 1 and root.joinpath(*owner[1:]).with_suffix(".py").is_file():
                owner = owner[:-1]  # a module, not a package: its package owns the name
            return ".".join(owner)
    return None


def _private_violations(root: Path = ROOT) -> list[str]:
    """Imports of a private module or name from outside the package that holds it (the package
    and its subpackages may use it)."""
    bad = []
    for layer in LAYERS:
        for path in sorted((root / layer).rglob("*.py")):
            package = ".".join(("mfuscope", *path.relative_to(root).parent.parts))
            for line, module in _imports(path, root):
                owner = _private_owner(module, root)
                if owner is not None and package != owner and not package.startswith(owner + "."):
                    bad.append(f"{path.relative_to(root)}:{line} imports {module}")
    return bad


def test_no_private_imports_across_packages() -> None:
    assert not _private_violations()


def test_the_private_rule_sees_a_violation(tmp_path: Path) -> None:
    for folder in ("agent", "cli/validate_gpu", "core/trace"):
        (tmp_path / folder).mkdir(parents=True)
    (tmp_path / "agent" / "topology.py").write_text("", encoding="utf-8")
    (tmp_path / "agent" / "_runtime.py").write_text(
        "from mfuscope.agent.topology import _env_int\nfrom . import _health\n", encoding="utf-8"
    )
    (tmp_path / "core" / "flight.py").write_text(
        "from mfuscope.core.trace._collectives import normalise_op\n"
        "from mfuscope.core.trace import _scan, read_trace\n"
        "from mfuscope.core._moved import warn_moved\n",
        encoding="utf-8",
    )
    (tmp_path / "cli" / "validate_gpu" / "probes.py").write_text(
        "def f():\n    from mfuscope.agent._health import RateLimitedLog\n"
        "    from mfuscope.agent import __version__, _health\n",
        encoding="utf-8",
    )
    found = [v.split(" imports ") for v in _private_violations(tmp_path)]
    assert found == [  # the agent's own and core's own private imports pass
        ["core/flight.py:1", "mfuscope.core.trace._collectives"],
        ["core/flight.py:1", "mfuscope.core.trace._collectives.normalise_op"],
        ["core/flight.py:2", "mfuscope.core.trace._scan"],
        ["cli/validate_gpu/probes.py:2", "mfuscope.agent._health"],
        ["cli/validate_gpu/probes.py:2", "mfuscope.agent._health.RateLimitedLog"],
        ["cli/validate_gpu/probes.py:3", "mfuscope.agent._health"],
    ]


def test_integrations_never_import_the_collector(tmp_path: Path) -> None:
    (tmp_path / "integrations").mkdir()
    (tmp_path / "integrations" / "probe.py").write_text(
        "from mfuscope.agent import Agent\nfrom mfuscope.collector.series import x\n",
        encoding="utf-8",
    )
    found = _violations("integrations", tmp_path)
    assert [v.split(" imports ")[1] for v in found] == [
        "mfuscope.collector.series",
        "mfuscope.collector.series.x",
    ]


@pytest.mark.slow  # a child Python process (a fresh import)
def test_importing_the_agent_loads_no_collector_module() -> None:
    code = (
        "import sys; from mfuscope.agent import Agent; "
        "print([m for m in sys.modules if m.startswith('mfuscope.collector')])"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    assert result.stdout.strip() == "[]"
