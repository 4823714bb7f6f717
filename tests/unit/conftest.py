"""Fixtures for every unit test."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

CACHE_DIR_VARIABLE = "MFUSCOPE_CPU_PEAK_CACHE_DIR"


@pytest.fixture(autouse=True, scope="session")
def cpu_peak_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Agents that calibrate a CPU peak keep it in this session's directory, never in the user's
    cache (one calibration per session and key, as on a machine)."""
    before = os.environ.get(CACHE_DIR_VARIABLE)
    os.environ[CACHE_DIR_VARIABLE] = str(tmp_path_factory.mktemp("cpu-peak-cache"))
    yield
    if before is None:
        os.environ.pop(CACHE_DIR_VARIABLE, None)
    else:
        os.environ[CACHE_DIR_VARIABLE] = before
