"""Fixtures shared by the unit tests."""

from __future__ import annotations

import importlib
from collections.abc import Iterator

import pytest


@pytest.fixture(scope="module", params=["one thread", "two halves"])
def scan_mode(request: pytest.FixtureRequest) -> Iterator[None]:
    """Run a module's tests twice: the C selection scans arrays of some size in two halves on
    two threads; "two halves" makes every array big enough (the split point may then land
    inside a string, where the first half's scan must not land on it), the other never."""
    scanner = importlib.import_module("mfuscope.core.trace._select_c")
    previous = scanner.set_split_min_bytes(0 if request.param == "two halves" else -1)
    yield
    scanner.set_split_min_bytes(previous)
