"""Fixtures shared by the agent's unit tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.step_records import FakeClock, use_recorder_clock


@pytest.fixture
def clock_start_ns() -> int:
    """What `clock` reads at first (a module overrides this fixture for another start)."""
    return 1_000_000_000


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch, clock_start_ns: int) -> Iterator[FakeClock]:
    """The recorder's clock, for the hot path and the slow path."""
    fake = FakeClock(clock_start_ns)
    with use_recorder_clock(monkeypatch, fake):
        yield fake
