"""Tests that read the real traces beside the checkout skip with one reason when they are absent.

A lone clone of the repository has no ``../shared``: its tests must skip (saying why), not fail
with "no such file"; CI, which has the folder, sets ``MFUSCOPE_REQUIRE_SHARED=1`` so that a
missing folder there fails instead of silently skipping.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.support import shared_data
from tests.support.shared_data import MISSING_REASON, REQUIRE_ENV, require

TESTS = Path(__file__).resolve().parents[1]
HELPER = Path(shared_data.__file__).resolve()
# A path into the folder beside the checkout built by hand (a "../" literal, or "/" joined with
# a "shared" string literal).
HAND_BUILT = re.compile(r"""["']\.\./""" + r"""shared|/\s*["']shared["']""")


def test_every_test_reaches_the_shared_folder_through_the_helper() -> None:
    offenders = [
        str(path.relative_to(TESTS))
        for path in sorted(TESTS.rglob("*.py"))
        if path.resolve() != HELPER and HAND_BUILT.search(path.read_text(encoding="utf-8"))
    ]
    assert offenders == [], f"use tests.support.shared_data instead in {offenders}"


def test_a_missing_file_skips_with_the_one_reason(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(REQUIRE_ENV, raising=False)
    with pytest.raises(pytest.skip.Exception, match="a lone clone lacks"):
        require(tmp_path / "absent.json.gz")
    assert "beside the checkout" in MISSING_REASON


def test_a_missing_file_fails_where_ci_requires_the_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(REQUIRE_ENV, "1")
    with pytest.raises(pytest.fail.Exception, match=REQUIRE_ENV):
        require(tmp_path / "absent.json.gz")


def test_a_present_file_is_returned(tmp_path: Path) -> None:
    present = tmp_path / "trace.json"
    present.write_text("{}")
    assert require(present) == present
