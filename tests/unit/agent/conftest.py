"""Fixtures shared by the agent's unit tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.step_records import (
    RECORDER_CORES,
    FakeClock,
    use_recorder_clock,
    use_recorder_core,
)


@pytest.fixture(params=RECORDER_CORES)
def recorder_core(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """Run a test on both of the step recorder's hot paths: C (where built) and Python (a module
    takes it for every test with `pytestmark = pytest.mark.usefixtures("recorder_core")`)."""
    use_recorder_core(monkeypatch, request.param)


@pytest.fixture
def clock_start_ns() -> int:
    """What `clock` reads at first (a module overrides this fixture for another start)."""
    return 1_000_000_000


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch, clock_start_ns: int) -> Iterator[FakeClock]:
    """The recorder's clock, for both hot paths and the slow path."""
    fake = FakeClock(clock_start_ns)
    with use_recorder_clock(monkeypatch, fake):
        yield fake
