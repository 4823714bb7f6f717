"""The window schedule's `Agreement` on torch.distributed's key-value store (imports torch lazily).

The store is the one the default process group was set up with (a `TCPStore` under torchrun or
`env://`): every rank of the job already reaches it. `StoreAgreement` makes each operation one or a
few round trips on the calling thread. `BackgroundAgreement` (what the agent uses) queues them to
the agent's periodic thread (`_periodic`), so the training thread never waits on the store: at
thousands of ranks the store's server answers one request at a time, and a round trip taken at a
check step by every rank at once costs the last rank the whole queue (figures:
benchmarks/RESULTS.md#window-agreement-at-scale). It talks to the server over a connection of its
own (a second `TCPStore` client to the same server), so its requests never queue behind, or hold
up, torch.distributed's own.
Keys live under a prefix naming the launch (its incarnation), so a relaunch, whose ranks restart the
schedule from its first window, never reads the old launch's answers.

The periodic thread never blocks in the store: a follower looks for the decision with `check` (which
answers at once), again after a growing back-off, and the agent's close stops the thread and joins
it. A thread left inside a blocking store call (a waiting `get`) when the interpreter exits is
fatal: if the call returns during finalisation, Python ends the thread with `pthread_exit`, whose
forced unwinding through PyTorch's binding (a destructor re-taking the GIL, implicitly noexcept)
calls `std::terminate` ("terminate called without an active exception") and the training process
aborts at its very end. A timed `wait` would bound the call, but PyTorch logs two warnings at every
timeout.
"""

from __future__ import annotations

import collections
import math
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from mfuscope.agent._periodic import Periodic, Task
from mfuscope.agent._window_schedule import AgreementError

__all__ = ["BackgroundAgreement", "StoreAgreement", "default_store_agreement", "own_client"]

# A maximum is kept with compare-and-set; concurrent raisers retry, each retry sees a new value.
_RAISE_ATTEMPTS = 16
# How long a follower looks for a decision: a decider that has not reached its check step in an
# hour has stopped training; the follower then stops profiling.
_DECISION_TIMEOUT_S = 3600.0
# Store operations of the agent's own connection (all answer at once) give up after this long.
_OPERATION_TIMEOUT = timedelta(minutes=5)
# A follower looks for a decision first after _FIRST_LOOK_S, then twice as long after each miss,
# at most _LAST_LOOK_S apart: a few requests per follower when the decider publishes within tens
# of milliseconds (the usual case: it decides at the same check step), one a second per follower
# when it is late, and none when the agent closes.
_FIRST_LOOK_S = 0.005
_LAST_LOOK_S = 1.0
# How long `close` waits for a round of store calls in progress.
_CLOSE_TIMEOUT_S = 5.0
# The pause of the periodic task with nothing queued and nothing looked for (it is woken sooner).
_IDLE_S = 3600.0


class StoreAgreement:
    """`Agreement` over a torch `Store` (anything with `set`, `get`, `compare_set`, `add` and
    `check`), every operation on the calling thread. It never `get`s a key that is not there
    (such a `get` waits for it, holding the connection, and with it any store operation of
    torch's on a shared store, until the decider publishes).
    """

    def __init__(self, store: Any, prefix: str) -> None:
        self._store = store
        self._prefix = prefix

    def publish(self, key: str, value: int) -> None:
        self._call(lambda: self._store.set(self._key(key), str(value)))

    def fetch(self, key: str) -> None:
        pass  # `fetched` asks the store itself

    def fetched(self, key: str) -> int | None:
        text = self._present(key)
        return None if text is None else _step(text, key)

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
        text = self._present(key)
        return None if text is None else _number(text, key)

    def close(self) -> None:
        pass

    def _present(self, key: str) -> str | None:
        """What `key` holds, None when it is absent (answers at once)."""
        full = self._key(key)
        if not self._call(lambda: self._store.check([full])):
            return None  # never `get` an absent key: that waits for it to appear
        result: str = self._call(lambda: self._store.get(full))
        return result

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


class BackgroundAgreement:
    """`Agreement` whose store operations run on a periodic thread, in the order they are asked.

    `connect` makes the `StoreAgreement` the task uses (called on the periodic thread, at once,
    so the connection is up long before the first decision). Calls from the training thread only
    queue work (and wake the task) or read what the task has fetched: `fetched` answers from the
    values fetched so far, `read` from the latest value read (and queues a refresh). The first
    failed operation ends the agreement: every call after it raises `AgreementError` with its
    reason. `tick` is the task (tests call it directly, with `clock` a fake).
    """

    def __init__(
        self,
        connect: Any,
        periodic: Periodic | None,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._connect = connect
        self._clock = clock
        self._agreement: StoreAgreement | None = None
        # Appended by the caller, popped by the task (a deque's append and popleft are atomic).
        self._work: collections.deque[tuple[str, str, Any]] = collections.deque()
        self._looking: dict[str, tuple[float, float]] = {}  # key -> (deadline, next pause)
        self._answers: dict[str, int] = {}
        self._values: dict[str, float | None] = {}
        self._reading: set[str] = set()  # keys with a refresh queued
        self._failure: str | None = None
        self._periodic = periodic
        self._task: Task | None = None if periodic is None else periodic.add("windows", self.tick)

    def publish(self, key: str, value: int) -> None:
        self._queue("publish", key, value)

    def fetch(self, key: str) -> None:
        self._queue("fetch", key, None)

    def fetched(self, key: str) -> int | None:
        self._raise_failure()
        return self._answers.get(key)

    def raise_to(self, key: str, value: float) -> None:
        self._queue("raise_to", key, value)

    def count(self, key: str) -> None:
        self._queue("count", key, None)

    def read(self, key: str) -> float | None:
        self._raise_failure()
        if key not in self._reading:
            self._reading.add(key)
            self._queue("read", key, None)
        return self._values.get(key)

    def close(self, timeout_s: float = _CLOSE_TIMEOUT_S) -> None:
        """Stop looking for decisions; what is queued (a decider's last publications) is done on
        this thread once a round in progress ended (waiting at most `timeout_s` for it)."""
        if self._periodic is not None and self._task is not None:
            self._periodic.remove(self._task, timeout_s)
        self._looking.clear()
        if self._work and self._failure is None and self._agreement is not None:
            self.tick()

    def _queue(self, kind: str, key: str, value: Any) -> None:
        self._raise_failure()
        self._work.append((kind, key, value))
        if self._periodic is not None and self._task is not None:
            self._periodic.wake(self._task)

    def _raise_failure(self) -> None:
        if self._failure is not None:
            raise AgreementError(self._failure)

    def tick(self) -> float | None:
        """Connect (the first time), do what is queued, look for the decisions awaited; the
        pause before the next look (s), None once the agreement failed."""
        try:
            if self._agreement is None:
                try:
                    self._agreement = self._connect()
                except Exception as exc:
                    raise AgreementError(
                        f"store: cannot connect: {type(exc).__name__}: {exc}"
                    ) from exc
            while self._work:
                kind, key, value = self._work.popleft()
                self._do(self._agreement, kind, key, value)
            return self._look(self._agreement)
        except AgreementError as exc:
            self._failure = str(exc)
            return None

    def _do(self, agreement: StoreAgreement, kind: str, key: str, value: Any) -> None:
        if kind == "publish":
            agreement.publish(key, value)
        elif kind == "fetch":
            if key not in self._answers:
                self._looking.setdefault(key, (self._clock() + _DECISION_TIMEOUT_S, _FIRST_LOOK_S))
        elif kind == "raise_to":
            agreement.raise_to(key, value)
        elif kind == "count":
            agreement.count(key)
        else:
            self._reading.discard(key)  # a read asked for after this one queues another
            self._values[key] = agreement.read(key)

    def _look(self, agreement: StoreAgreement) -> float:
        """Look once for each decision awaited, until it is there or the decider is an hour late
        (the agreement then fails: the follower stops profiling); each look after a back-off."""
        pauses = [_IDLE_S]
        for key, (deadline, pause) in list(self._looking.items()):
            found = agreement.fetched(key)
            if found is not None:
                self._answers[key] = found
                del self._looking[key]
                continue
            if self._clock() > deadline:
                raise AgreementError(f"no decision under {key!r} within {_DECISION_TIMEOUT_S} s")
            self._looking[key] = (deadline, min(2 * pause, _LAST_LOOK_S))
            pauses.append(pause)
        return min(pauses)


def _step(text: str, key: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise AgreementError(f"store key {key!r} holds {text!r}, not a step") from None


def _number(text: str, key: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise AgreementError(f"store key {key!r} holds {text!r}, not a number") from None
    if not math.isfinite(value):
        raise AgreementError(f"store key {key!r} holds {text!r}, not a finite number")
    return value


def own_client(store: Any) -> Any | None:
    """A connection of its own to `store`'s server: a new `TCPStore` client for the `TCPStore`
    under any `PrefixStore` wrappers; None for other kinds (a `FileStore`, a `HashStore`)."""
    import torch.distributed as dist

    base = store
    while isinstance(base, dist.PrefixStore):
        base = base.underlying_store
    if not isinstance(base, dist.TCPStore):
        return None
    return dist.TCPStore(
        base.host,
        base.port,
        is_master=False,
        timeout=_OPERATION_TIMEOUT,
        use_libuv=bool(getattr(base, "libuvBackend", True)),
    )


def _connect(store: Any, prefix: str) -> StoreAgreement:
    """The agreement's own connection to the job's store; a store without connections (a file)
    is shared with torch.distributed (never waited on either way: `StoreAgreement`)."""
    client = own_client(store)
    return StoreAgreement(store if client is None else client, prefix)


def default_store_agreement(incarnation: str, periodic: Periodic) -> BackgroundAgreement | None:
    """The agreement on the default group's store, its store calls on `periodic`'s thread; None
    when torch.distributed is not initialised or its store cannot be had (private but present
    since torch 1.x)."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return None
    from torch.distributed import distributed_c10d as c10d

    store = c10d._get_default_store()
    prefix = f"mfuscope/windows/{incarnation}"
    return BackgroundAgreement(lambda: _connect(store, prefix), periodic)
