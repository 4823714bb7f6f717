"""Old import paths of moved modules still work for one minor version: importing one gives the
same objects as the new path and a `DeprecationWarning` that names the new path and the release
that drops the old one, pointed at the line that imported it."""

from __future__ import annotations

import importlib
import re
import sys
import warnings
from pathlib import Path
from types import ModuleType

import pytest
from mfuscope.core.moved import REMOVED_IN

ROOT = Path(__file__).resolve().parents[2]

# old module -> the module its names moved to
MOVED: dict[str, str] = {
    "mfuscope.core.aggregate": "mfuscope.core.run_summary",
    "mfuscope.core.aggregate.run": "mfuscope.core.run_summary.run_data",
    "mfuscope.core.aggregate.decompose": "mfuscope.core.run_summary.breakdowns",
    "mfuscope.core.aggregate.bandwidth": "mfuscope.core.run_summary.tier_bandwidth",
    "mfuscope.core.aggregate.stragglers": "mfuscope.core.run_summary.rank_pace",
    "mfuscope.core.links": "mfuscope.core.interconnects",
    "mfuscope.agent.sampler": "mfuscope.agent.profiler_windows",
}
# old module -> (name, the module it moved to), for names that left a module that stays
MOVED_NAMES: dict[str, tuple[str, str]] = {
    "mfuscope.collector.ingest": ("Aggregator", "mfuscope.collector.aggregator"),
}


def _import_fresh(name: str) -> tuple[ModuleType, list[warnings.WarningMessage]]:
    """Import `name` as a first import would (its module and old parents out of sys.modules)."""
    for loaded in [m for m in sys.modules if m == name or name.startswith(m + ".")]:
        if loaded in MOVED:
            del sys.modules[loaded]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        __import__(name)  # a builtin: the importing frame is this test's, as in a user's file
    return sys.modules[name], caught


@pytest.mark.parametrize(("old", "new"), sorted(MOVED.items()))
def test_old_path_warns_and_gives_the_same_objects(old: str, new: str) -> None:
    module, caught = _import_fresh(old)
    ours = [w for w in caught if issubclass(w.category, DeprecationWarning)]
    message = (
        f"{old} has moved to {new}; import it from there ({old} goes in mfuscope {REMOVED_IN})"
    )
    assert [str(w.message) for w in ours if str(w.message).startswith(f"{old} ")] == [message]
    assert {w.filename for w in ours} == {__file__}
    target = importlib.import_module(new)
    public = getattr(target, "__all__", [])
    assert set(public) <= set(module.__all__)
    for name in module.__all__:
        assert getattr(module, name) is getattr(target, name), name


@pytest.mark.parametrize(("old", "moved"), sorted(MOVED_NAMES.items()))
def test_old_name_warns_and_is_the_same_object(old: str, moved: tuple[str, str]) -> None:
    name, new = moved
    module = importlib.import_module(old)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        value = getattr(module, name)
    message = (
        f"{old}.{name} has moved to {new}.{name}; import it from there "
        f"({old}.{name} goes in mfuscope {REMOVED_IN})"
    )
    assert [(str(w.message), w.category, w.filename) for w in caught] == [
        (message, DeprecationWarning, __file__)
    ]
    assert value is getattr(importlib.import_module(new), name)
    assert name not in module.__all__
    with pytest.raises(AttributeError, match="no attribute 'Nothing'"):
        _ = module.Nothing


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in text.split("."))


def _shims() -> set[str]:
    """Every module in the packages that calls `warn_moved`: the old paths still served."""
    shims = set()
    for path in ROOT.glob("*/**/*.py"):
        if path.parts[len(ROOT.parts)] not in ("core", "agent", "collector", "cli", "exporters"):
            continue
        if re.search(r"^\s*warn_moved\(", path.read_text(encoding="utf-8"), re.MULTILINE):
            parts = path.relative_to(ROOT).with_suffix("").parts
            shims.add(".".join(("mfuscope", *parts)).removesuffix(".__init__"))
    return shims


def test_no_old_path_outlives_the_release_its_warning_names() -> None:
    """Each warning promises the old path goes in `REMOVED_IN`: a package at or past that
    version that still serves one breaks the promise."""
    text = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    found = re.search(r'^version = "(\d+\.\d+\.\d+)"$', text, re.MULTILINE)
    assert found is not None
    served = _shims() | set(MOVED_NAMES)
    assert not served or _version(found[1]) < _version(REMOVED_IN), sorted(served)


def test_every_old_path_in_the_tree_is_tested() -> None:
    """A shim added without a row here fails: each module that calls `warn_moved` is listed."""
    assert _shims() == set(MOVED) | set(MOVED_NAMES)
