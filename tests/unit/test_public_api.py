"""The public surface is a snapshot: a public name that appears, changes or goes fails here.

The public surface of mfuscope is every module whose dotted path has no part starting with ``_``
and, in each, the names its ``__all__`` lists (a package's ``__all__`` is in its ``__init__``).
Everything else is private by name. ``tests/unit/public_api.txt`` holds the surface as one line
per module; after a deliberate change, rewrite it with

    python tests/unit/test_public_api.py --write

and say in the commit why the surface changed.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("core", "agent", "collector", "exporters", "cli", "integrations")
SNAPSHOT = Path(__file__).with_name("public_api.txt")


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(["mfuscope", *parts])


def _declared_all(path: Path) -> list[str] | None:
    """The literal ``__all__`` of a module (None when it has none)."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    for node in tree.body:
        targets = (
            node.targets
            if isinstance(node, ast.Assign)
            else [node.target]
            if isinstance(node, ast.AnnAssign) and node.value is not None
            else []
        )
        if any(isinstance(t, ast.Name) and t.id == "__all__" for t in targets):
            value = ast.literal_eval(node.value)  # type: ignore[union-attr, arg-type]
            return sorted(value)
    return None


def public_modules() -> dict[str, list[str] | None]:
    """Every public module and the names it exports (None: it declares no ``__all__``)."""
    found: dict[str, list[str] | None] = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            relative = path.relative_to(ROOT).parts
            if any(part.startswith("_") and part != "__init__.py" for part in relative):
                continue
            if not (path.parent / "__init__.py").exists():
                continue  # a script folder (e.g. the demo's job), not a module of the package
            found[_module_name(path)] = _declared_all(path)
    return found


def render(surface: dict[str, list[str] | None]) -> str:
    return "".join(f"{module}: {', '.join(names or [])}\n" for module, names in surface.items())


def test_every_public_module_declares_its_names() -> None:
    missing = [module for module, names in public_modules().items() if names is None]
    assert not missing, f"public modules without __all__ (list their names, or rename): {missing}"


def test_the_public_surface_is_the_snapshot() -> None:
    current = render(public_modules())
    recorded = SNAPSHOT.read_text(encoding="utf-8")
    assert current == recorded, (
        "the public surface changed; if on purpose: python tests/unit/test_public_api.py --write"
    )


def test_the_snapshot_catches_a_new_public_name(tmp_path: Path) -> None:
    surface = public_modules()
    module = "mfuscope.core.schema"
    grown = {**surface, module: [*(surface[module] or []), "new_public_name"]}
    assert render(grown) != SNAPSHOT.read_text(encoding="utf-8")


if __name__ == "__main__":
    if sys.argv[1:] != ["--write"]:
        sys.exit("usage: python tests/unit/test_public_api.py --write")
    SNAPSHOT.write_text(render(public_modules()), encoding="utf-8")
    print(f"wrote {SNAPSHOT.relative_to(ROOT)}")
