"""ruff (lint + format) and mypy over the packages: the house style is enforced by the suite."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # ruff and mypy run as child processes

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("core", "agent", "collector", "exporters", "cli", "integrations")
BIN = Path(sys.executable).parent


def _run(args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, cwd=cwd, capture_output=True, text=True, timeout=600)


def test_ruff_lint_and_format() -> None:
    ruff = str(BIN / "ruff") if (BIN / "ruff").exists() else shutil.which("ruff")
    assert ruff, "ruff is a dev dependency"
    lint = _run([ruff, "check", "."], ROOT)
    assert lint.returncode == 0, lint.stdout + lint.stderr
    fmt = _run([ruff, "format", "--check", "."], ROOT)
    assert fmt.returncode == 0, fmt.stdout + fmt.stderr


def test_mypy_strict_on_packages(tmp_path: Path) -> None:
    # The top-level folders map onto mfuscope.*; mypy needs that layout on disk, so mirror it
    # with symlinks.
    pkg_root = tmp_path / "mfuscope"
    pkg_root.mkdir()
    for name in PACKAGES:
        (pkg_root / name).symlink_to(ROOT / name)
    args = [sys.executable, "-m", "mypy", "--config-file", str(ROOT / "pyproject.toml")]
    args += ["--explicit-package-bases", "--cache-dir", str(ROOT / ".mypy_cache")]
    for name in PACKAGES:
        args += ["-p", f"mfuscope.{name}"]
    result = _run(args, tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
