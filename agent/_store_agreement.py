"""The window schedule's `Agreement` on torch.distributed's key-value store (imports torch lazily).

The store is the one the default process group was set up with (a `TCPStore` under torchrun or
`env://`): every rank of the job already reaches it, and its `compare_set` is atomic on the
server, which is all a first-writer-wins decision needs. Each operation is one round trip that
waits for no other rank. Keys live under a prefix naming the launch (its incarnation), so a
relaunch, whose ranks restart the schedule from its first window, never reads the old launch's
answers.
"""

from __future__ import annotations

import math
from typing import Any

from mfuscope.agent.window_schedule import AgreementError

__all__ = ["StoreAgreement", "default_store_agreement"]

# A maximum is kept with compare-and-set; concurrent raisers retry, each retry sees a new value.
_RAISE_ATTEMPTS = 16


class StoreAgreement:
    """`Agreement` over a torch `Store` (anything with `compare_set`, `check` and `get`)."""

    def __init__(self, store: Any, prefix: str) -> None:
        self._store = store
        self._prefix = prefix

    def decide(self, key: str, offer: int) -> int:
        # compare_set with expected "" sets the key only when it is absent, and returns the
        # value the key holds afterwards: the first offer, whoever made it.
        answer = self._call(lambda: self._store.compare_set(self._key(key), "", str(offer)))
        try:
            return int(answer)
        except ValueError:
            raise AgreementError(f"store key {key!r} holds {answer!r}, not a step") from None

    def raise_to(self, key: str, value: float) -> None:
        full = self._key(key)
        wanted = repr(float(value))
        current = self._call(lambda: self._store.compare_set(full, "", wanted))
        for _ in range(_RAISE_ATTEMPTS):
            if _number(current, key) >= value:
                return
            current = self._swap(full, current, wanted)
        raise AgreementError(f"store key {key!r} kept changing; cost not published")

    def count(self, key: str) -> None:
        self._call(lambda: self._store.add(self._key(key), 1))

    def read(self, key: str) -> float | None:
        full = self._key(key)
        if not self._call(lambda: self._store.check([full])):
            return None  # never `get` an absent key: that waits for it to appear
        return _number(self._call(lambda: self._store.get(full)), key)

    def _swap(self, full_key: str, expected: str, wanted: str) -> str:
        """Set `full_key` to `wanted` if it still holds `expected`; what it holds afterwards."""
        result: str = self._call(lambda: self._store.compare_set(full_key, expected, wanted))
        return result

    def _key(self, key: str) -> str:
        return f"{self._prefix}/{key}"

    @staticmethod
    def _call(action: Any) -> Any:
        try:
            result = action()
        except Exception as exc:  # the store's errors are RuntimeError / DistStoreError
            raise AgreementError(f"store: {type(exc).__name__}: {exc}") from exc
        return result.decode() if isinstance(result, bytes) else result


def _number(text: str, key: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise AgreementError(f"store key {key!r} holds {text!r}, not a number") from None
    if not math.isfinite(value):
        raise AgreementError(f"store key {key!r} holds {text!r}, not a finite number")
    return value


def default_store_agreement(incarnation: str) -> StoreAgreement | None:
    """The agreement on the default group's store, None when torch.distributed is not
    initialised or its store cannot be had (private but present since torch 1.x)."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return None
    from torch.distributed import distributed_c10d as c10d

    store = c10d._get_default_store()
    return StoreAgreement(store, f"mfuscope/windows/{incarnation}")
