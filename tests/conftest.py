"""The two test tiers.

`pytest` runs the whole suite (what CI runs, `./dev test`). `pytest --fast` (`./dev test --fast`)
runs only the tests not marked `slow`: no integration folder, no child process, no server, no
wall-clock wait, and Hypothesis derandomized (the same examples every run). The fast tier's
contract is enforced, not hoped for: a test not marked `slow` that starts a process, binds or
connects a socket, or sleeps fails at that call, in either tier (`tests/support/fast_tier.py`).
"""

from __future__ import annotations

from collections.abc import Generator
from pathlib import Path

import pytest

from tests.support import fast_tier

INTEGRATION = Path(__file__).resolve().parent / "integration"


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--fast",
        action="store_true",
        default=False,
        help="the fast tier: only tests not marked slow (no processes, servers or sleeps)",
    )


def pytest_configure(config: pytest.Config) -> None:
    if config.getoption("fast"):
        # The same examples on every run of the fast tier (the whole suite keeps exploring).
        from hypothesis import settings

        settings.register_profile("fast", derandomize=True)
        settings.load_profile("fast")


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    # Every integration test is slow (checked below in the whole run): the fast tier does not even
    # import those modules, nor the jobs and frameworks they pull in.
    if config.getoption("fast") and collection_path.is_relative_to(INTEGRATION):
        return True
    return None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    unmarked = [
        item.nodeid
        for item in items
        if item.path.is_relative_to(INTEGRATION) and item.get_closest_marker("slow") is None
    ]
    if unmarked:
        raise pytest.UsageError(
            "integration tests must be marked slow (the fast tier skips the folder): "
            + ", ".join(unmarked[:5])
        )
    if not config.getoption("fast"):
        # The slow tests first (a stable sort): the workers, handed files in this order, start the
        # long ones early and end on short unit tests instead of one worker's long tail.
        items.sort(key=lambda item: item.get_closest_marker("slow") is None)
        return
    slow = [item for item in items if item.get_closest_marker("slow") is not None]
    if slow:
        config.hook.pytest_deselected(items=slow)
        items[:] = [item for item in items if item.get_closest_marker("slow") is None]


_GUARD = pytest.StashKey[fast_tier.Guard]()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item: pytest.Item) -> Generator[None, object, object]:
    # From the start of setup to the end of teardown, so a fixture of any scope that a fast test
    # sets up is held to the same rules as the test itself.
    if item.get_closest_marker("slow") is None:
        guard = item.stash[_GUARD] = fast_tier.Guard(item.nodeid)
        guard.start()
    return (yield from _checked(item))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Generator[None, object, object]:
    return (yield from _checked(item))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(
    item: pytest.Item, nextitem: pytest.Item | None
) -> Generator[None, object, object]:
    try:
        return (yield from _checked(item))
    finally:
        guard = item.stash.get(_GUARD, None)
        if guard is not None:
            guard.stop()


def _checked(item: pytest.Item) -> Generator[None, object, object]:
    """Run the phase; then fail it on any forbidden call it made, even one that the code under
    test caught. A phase that failed already keeps its own error (a refused call raised
    there is most likely it) and its attempts are not reported again by the next phase."""
    guard = item.stash.get(_GUARD, None)
    try:
        result = yield
    except BaseException:
        if guard is not None:
            guard.attempts.clear()
        raise
    if guard is not None:
        guard.check()
    return result
