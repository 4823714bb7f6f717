"""Per-client token buckets with an injected clock."""

from __future__ import annotations

import pytest
from mfuscope.collector._errors import RateLimited
from mfuscope.collector._ratelimit import RateLimiter

from tests.support.collector_fakes import FakeClock


def test_burst_then_steady_rate() -> None:
    clock = FakeClock()
    limiter = RateLimiter(4.0, 2, monotonic=clock.monotonic)
    limiter.check("a")
    limiter.check("a")
    with pytest.raises(RateLimited) as info:
        limiter.check("a")
    assert info.value.retry_after_s == pytest.approx(0.25)
    assert info.value.status == 429
    clock.advance(0.25)
    limiter.check("a")
    with pytest.raises(RateLimited):
        limiter.check("a")


def test_idle_clients_are_forgotten() -> None:
    clock = FakeClock()
    limiter = RateLimiter(1.0, 2, monotonic=clock.monotonic)
    for client in ("a", "b", "c"):
        limiter.check(client)
    assert limiter.clients == 3
    clock.advance(3)  # every bucket refilled: nothing to remember
    limiter.check("d")
    assert limiter.clients == 1


@pytest.mark.parametrize(("rate", "burst"), [(0.0, 1), (float("inf"), 1), (1.0, 0.5)])
def test_misuse(rate: float, burst: float) -> None:
    with pytest.raises(ValueError):
        RateLimiter(rate, burst, monotonic=FakeClock().monotonic)
