"""Packages found, not listed, and the one compiled part.

Every top-level folder in `_LAYERS` is the package `mfuscope.<folder>`; each of its subfolders
that has an `__init__.py` is a subpackage, found here by walking the tree, so a new subpackage
ships without anyone editing a list (a hand-kept list once left `mfuscope.core.aggregate` and
`mfuscope.cli.validate_gpu` out of the wheel). `mfuscope.deploy` is data only: the Prometheus
configuration and rules that `mfuscope demo --prometheus` runs with.

The one compiled part, the trace-event pre-filter (core/trace/_select.c), is built with
`optional=True`: without a C compiler the build goes on without it and the same work runs in
Python (same results, slower). Everything else is configured in pyproject.toml.
"""

from __future__ import annotations

import os
from pathlib import Path

from setuptools import Extension, setup

ROOT = Path(__file__).resolve().parent
# The architecture's layers (docs/architecture.md#layers): folder -> import name mfuscope.<folder>.
_LAYERS = ("core", "agent", "collector", "exporters", "cli", "integrations")
# Files any installed subcommand reads at run time, per data package, relative to its folder.
_DATA = {"deploy": ["prometheus/prometheus.yml", "prometheus/rules/*.yml"]}


def _subpackages(folder: str) -> dict[str, str]:
    """`mfuscope.<folder>` and every subpackage under it -> its folder, relative to the root."""
    found: dict[str, str] = {}
    for directory, subdirs, files in os.walk(ROOT / folder):
        subdirs[:] = sorted(d for d in subdirs if d != "__pycache__" and not d.startswith("."))
        if "__init__.py" not in files:
            subdirs.clear()  # not a package: nothing below it is importable as one
            continue
        relative = Path(directory).relative_to(ROOT)
        found[".".join(("mfuscope", *relative.parts))] = relative.as_posix()
    return found


def package_map() -> dict[str, str]:
    """Every package the wheel holds -> its source folder (also read by the packaging test)."""
    packages: dict[str, str] = {}
    for layer in _LAYERS:
        packages.update(_subpackages(layer))
    packages.update({f"mfuscope.{folder}": folder for folder in _DATA})
    return packages


def package_data() -> dict[str, list[str]]:
    """py.typed in every code package, the data packages' files."""
    data = {name: ["py.typed"] for name in package_map() if name.count(".") == 1}
    data.update({f"mfuscope.{folder}": patterns for folder, patterns in _DATA.items()})
    return data


# POSIX threads: big traces are scanned in two halves at once.
_THREADS = ["-pthread"] if os.name == "posix" else []

if __name__ == "__main__":
    packages = package_map()
    setup(
        packages=sorted(packages),
        package_dir=packages,
        package_data=package_data(),
        ext_modules=[
            Extension(
                "mfuscope.core.trace._select_c",
                sources=["core/trace/_select.c"],
                extra_compile_args=["-O2", *_THREADS],
                extra_link_args=_THREADS,
                optional=True,
            ),
        ],
    )
