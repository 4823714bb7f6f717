"""Per-client request rate limiting: a token bucket per client address.

Each client may make `rate_per_s` requests per second on average with bursts of `burst`. The
clock is injected. Idle buckets are forgotten once full again, so memory follows active clients.
Thread-safe (one small lock), because the HTTP layer may run handlers on several threads.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable

from mfuscope.collector._errors import RateLimited

__all__ = ["RateLimiter"]


class RateLimiter:
    """Token buckets keyed by client. `check(client)` spends one token or raises `RateLimited`."""

    def __init__(self, rate_per_s: float, burst: float, *, monotonic: Callable[[], float]) -> None:
        if not (rate_per_s > 0 and math.isfinite(rate_per_s)):
            raise ValueError(f"rate_per_s must be a positive number, got {rate_per_s}")
        if not burst >= 1:
            raise ValueError(f"burst must be >= 1, got {burst}")
        self.rate_per_s = rate_per_s
        self.burst = float(burst)
        self._monotonic = monotonic
        self._buckets: dict[str, tuple[float, float]] = {}  # client -> (tokens, at time)
        self._lock = threading.Lock()
        self._next_sweep = monotonic()

    def check(self, client: str) -> None:
        """Spend one token of `client`'s bucket, or raise `RateLimited` with the wait in seconds."""
        with self._lock:
            now = self._monotonic()
            if now >= self._next_sweep:
                self._sweep(now)
            tokens, at = self._buckets.get(client, (self.burst, now))
            tokens = min(self.burst, tokens + (now - at) * self.rate_per_s)
            if tokens < 1.0:
                self._buckets[client] = (tokens, now)
                wait_s = (1.0 - tokens) / self.rate_per_s
                raise RateLimited(
                    "client", f"over {self.rate_per_s:g} requests/s from {client}", wait_s
                )
            self._buckets[client] = (tokens - 1.0, now)

    def _sweep(self, now: float) -> None:
        # A bucket that has refilled completely is indistinguishable from a new one: drop it.
        refill_s = self.burst / self.rate_per_s
        self._buckets = {c: (t, at) for c, (t, at) in self._buckets.items() if now - at < refill_s}
        self._next_sweep = now + max(refill_s, 1.0)

    @property
    def clients(self) -> int:
        """Clients currently tracked (those whose bucket is not full)."""
        return len(self._buckets)
